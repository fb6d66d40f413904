module vk-sandbox.local/e2e/sdk-driver

go 1.26.0

require sigs.k8s.io/agent-sandbox v1.0.3

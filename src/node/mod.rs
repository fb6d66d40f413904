//! The virtual Node: its desired shape (pure), registration/adoption and
//! status heartbeats, and the node Lease.

pub mod desired;
pub mod lease;
pub mod register;

pub use desired::NodeSettings;

impl NodeSettings {
    /// The Node's part of the configuration.
    pub fn from_config(cfg: &crate::config::Config) -> NodeSettings {
        NodeSettings {
            name: cfg.node_name.clone(),
            ip: cfg.node_ip.clone(),
            kubelet_port: cfg.listen_addr.port,
            cpu: cfg.capacity.cpu.0.clone(),
            memory: cfg.capacity.memory.0.clone(),
            pods: cfg.capacity.pods.0.clone(),
            extra_labels: cfg.node_labels.clone(),
            fixed: desired::Fixed {
                cpu: cfg.capacity.cpu_fixed,
                memory: cfg.capacity.memory_fixed,
                pods: cfg.capacity.pods_fixed,
            },
        }
    }
}

//! Every sandbox a network endpoint of its own (docs/pod-network.md): a
//! Pod address from `--pod-cidr` per claim, and vk-sandbox answering TCP
//! on it, each connection relayed to the same port in the guest through
//! sandboxd's `/ports` relay, after the NetworkPolicies selecting the Pod
//! have allowed it.
//!
//! - [`range`]: the range and which address a new claim gets (pure);
//! - [`netns`]: sockets in the namespace Pod addresses live in;
//! - [`listeners`]: one listener per Pod address and declared port;
//! - [`relay`]: one connection, admitted, then relayed.
//!
//! A leaf: the Pods and claims reach it through [`listeners::Endpoints`],
//! sandboxd through [`relay::GuestPorts`], the policies through
//! [`relay::Admission`] (wired in `main.rs`).

pub mod listeners;
pub mod netns;
pub mod range;
pub mod relay;

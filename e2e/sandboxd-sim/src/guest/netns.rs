//! A guest network of its own for each simulated VM: a Linux network
//! namespace holding only a loopback interface (up), as a microVM without
//! a NIC has only its own loopback.
//!
//! - The VM's commands run inside it: the child enters it between fork and
//!   exec ([`NetNs::enter_in_child`]).
//! - `/ports/{port}` dials `127.0.0.1:{port}` inside it: a short-lived
//!   thread enters the namespace, connects and ends; the socket stays in
//!   the namespace ([`NetNs::dial`]). Nothing listening answers at once.
//! - The VM's processes are the processes in it ([`NetNs::processes`]):
//!   whatever an exec started in the background, a daemon that left its
//!   session included, is stopped, continued and killed with the VM.
//!
//! The namespace lives as long as the simulator holds its descriptor (and
//! any process is in it); nothing is mounted, so a crashed simulator
//! leaves nothing on the host. [`NetNs::path`] names it for other tools
//! (`nsenter --net=PATH`) while the simulator runs.
//!
//! Making a namespace needs CAP_SYS_ADMIN (root). Without it the simulator
//! says so at start-up and its guests share the host's loopback
//! ([`GuestNetwork`]).

use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use rustix::process::{Pid, Signal};
use rustix::thread::{LinkNameSpaceType, UnshareFlags};

/// How long a dial inside the namespace may take (a listener whose backlog
/// is full leaves the SYN unanswered).
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the VMs' guest networks are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuestNetwork {
    /// A network namespace per VM.
    Namespaces,
    /// The host's: guest port N is the host's 127.0.0.1:N. The reason is
    /// why namespaces are not used.
    HostLoopback(String),
}

impl GuestNetwork {
    /// What the simulator says about it (start-up log, `/_sim/state`).
    pub fn describe(&self) -> String {
        match self {
            GuestNetwork::Namespaces => {
                "a network namespace per VM (its own loopback, up)".to_string()
            }
            GuestNetwork::HostLoopback(why) => format!(
                "the host's loopback, shared by every VM: guest port N is the host's \
                 127.0.0.1:N ({why})"
            ),
        }
    }
}

/// One VM's network namespace.
#[derive(Debug)]
pub struct NetNs {
    fd: OwnedFd,
    /// The namespace's identity (device and inode of its nsfs file).
    dev: u64,
    ino: u64,
}

fn on_thread<T: Send + 'static>(
    name: &str,
    work: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(work)?
        .join()
        .map_err(|_| io::Error::other(format!("{name}: the thread panicked")))?
}

impl NetNs {
    /// A fresh namespace with its loopback up. Made on a thread of its own
    /// (a namespace is a thread's), which ends once the namespace is held
    /// by the descriptor.
    pub fn create() -> io::Result<NetNs> {
        on_thread("sim-netns-new", || {
            // SAFETY: only the network namespace is unshared, never the
            // descriptor table, and only on this thread, which ends here.
            unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWNET) }
                .map_err(|e| io::Error::new(e.kind(), format!("unshare(CLONE_NEWNET): {e}")))?;
            loopback_up()?;
            let file = File::open("/proc/thread-self/ns/net")?;
            let meta = file.metadata()?;
            Ok(NetNs {
                fd: OwnedFd::from(file),
                dev: meta.dev(),
                ino: meta.ino(),
            })
        })
    }

    /// A path naming the namespace while the simulator runs: its
    /// descriptor in `/proc` (e.g. `nsenter --net=PATH`).
    pub fn path(&self) -> String {
        format!("/proc/{}/fd/{}", std::process::id(), self.fd.as_raw_fd())
    }

    /// Connect to `127.0.0.1:port` inside the namespace.
    pub async fn dial(&self, port: u16) -> io::Result<tokio::net::TcpStream> {
        let fd = self.fd.try_clone()?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("sim-netns-dial".into())
            .spawn(move || {
                let dialled = enter(fd.as_fd()).and_then(|()| {
                    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
                    let s = std::net::TcpStream::connect_timeout(&addr, DIAL_TIMEOUT)?;
                    s.set_nonblocking(true)?;
                    Ok(s)
                });
                let _ = tx.send(dialled);
            })?;
        let stream = rx
            .await
            .map_err(|_| io::Error::other("the dialling thread ended without an answer"))??;
        tokio::net::TcpStream::from_std(stream)
    }

    /// What a child runs between fork and exec to enter the namespace.
    pub fn enter_in_child(&self) -> impl FnMut() -> io::Result<()> + Send + Sync + 'static {
        let raw: RawFd = self.fd.as_raw_fd();
        move || {
            // SAFETY: the descriptor is open in the parent while it spawns
            // (the VM holds it), so it is open in the forked child too.
            let fd = unsafe { BorrowedFd::borrow_raw(raw) };
            // No allocation between fork and exec: the bare OS error.
            rustix::thread::move_into_link_name_space(fd, Some(LinkNameSpaceType::Network))
                .map_err(|e| io::Error::from_raw_os_error(e.raw_os_error()))
        }
    }

    /// Every process in the namespace (this simulator excepted).
    pub fn processes(&self) -> Vec<Pid> {
        let me = std::process::id();
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| pid != me)
            .filter(|pid| {
                std::fs::metadata(format!("/proc/{pid}/ns/net"))
                    .is_ok_and(|m| m.dev() == self.dev && m.ino() == self.ino)
            })
            .filter_map(|pid| i32::try_from(pid).ok().and_then(Pid::from_raw))
            .collect()
    }

    /// Signal every process in the namespace. A process may fork while
    /// the list is read, so the list is read again until a pass finds no
    /// process it had not signalled (at most a few passes). Returns how
    /// many processes were signalled.
    pub fn signal_all(&self, sig: Signal) -> usize {
        let mut done = std::collections::BTreeSet::new();
        for _ in 0..4 {
            let fresh: Vec<Pid> = self
                .processes()
                .into_iter()
                .filter(|p| !done.contains(&p.as_raw_nonzero().get()))
                .collect();
            if fresh.is_empty() {
                break;
            }
            for pid in fresh {
                // Gone meanwhile: nothing to signal.
                let _ = rustix::process::kill_process(pid, sig);
                done.insert(pid.as_raw_nonzero().get());
            }
        }
        done.len()
    }
}

/// Move the calling thread into the network namespace `fd`.
fn enter(fd: BorrowedFd<'_>) -> io::Result<()> {
    rustix::thread::move_into_link_name_space(fd, Some(LinkNameSpaceType::Network))
        .map_err(|e| io::Error::new(e.kind(), format!("setns(CLONE_NEWNET): {e}")))
}

/// Bring `lo` up in the calling thread's network namespace (a new
/// namespace's loopback is down).
fn loopback_up() -> io::Result<()> {
    let sock = rustix::net::socket(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::DGRAM,
        None,
    )?;
    // SAFETY: `ifreq` is plain data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: a valid socket and a valid, NUL-terminated `ifreq` the kernel
    // reads (and for SIOCGIFFLAGS writes) in place.
    unsafe {
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut req) < 0 {
            return Err(io::Error::other(format!(
                "read the loopback's flags: {}",
                io::Error::last_os_error()
            )));
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS as _, &req) < 0 {
            return Err(io::Error::other(format!(
                "bring the loopback up: {}",
                io::Error::last_os_error()
            )));
        }
    }
    Ok(())
}

/// Whether this process may make network namespaces: it makes one (and
/// drops it at once).
pub fn probe() -> GuestNetwork {
    match NetNs::create() {
        Ok(_) => GuestNetwork::Namespaces,
        Err(e) => GuestNetwork::HostLoopback(format!(
            "cannot make a network namespace: {e}; run the simulator as root for a \
             guest network per VM"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Skips (with the reason) where namespaces cannot be made.
    fn ns_or_skip() -> Option<NetNs> {
        match NetNs::create() {
            Ok(ns) => Some(ns),
            Err(e) => {
                eprintln!("SKIPPED: no network namespaces here: {e}");
                None
            }
        }
    }

    #[tokio::test]
    async fn a_namespace_has_its_own_loopback_and_keeps_its_sockets() {
        let Some(ns) = ns_or_skip() else { return };
        // A host listener is not reachable from inside.
        let host = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = host.local_addr().expect("addr").port();
        let refused = ns.dial(port).await.expect_err("the host's port inside");
        assert_eq!(
            refused.kind(),
            io::ErrorKind::ConnectionRefused,
            "{refused}"
        );

        // A listener made inside (on a thread in the namespace) is.
        let fd = ns.fd.try_clone().expect("dup");
        let inside = on_thread("test-listen", move || {
            enter(fd.as_fd())?;
            std::net::TcpListener::bind("127.0.0.1:0")
        })
        .expect("listen inside");
        let inner_port = inside.local_addr().expect("addr").port();
        let mut s = ns.dial(inner_port).await.expect("dial inside");
        let (mut peer, _) = inside.accept().expect("accept");
        use std::io::Read;
        use tokio::io::AsyncWriteExt;
        s.write_all(b"ping").await.expect("write");
        let mut got = [0u8; 4];
        peer.read_exact(&mut got).expect("read");
        assert_eq!(&got, b"ping");
        // The host does not see the inner port.
        assert!(std::net::TcpStream::connect(("127.0.0.1", inner_port)).is_err());
        assert!(ns.path().starts_with("/proc/"), "{}", ns.path());
    }

    #[test]
    fn a_child_enters_the_namespace_and_is_found_in_it() {
        let Some(ns) = ns_or_skip() else { return };
        assert!(ns.processes().is_empty());
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("30");
        use std::os::unix::process::CommandExt;
        // SAFETY: `enter_in_child` makes one system call (setns).
        unsafe { cmd.pre_exec(ns.enter_in_child()) };
        let mut child = cmd.spawn().expect("spawn sleep");
        let pid = child.id();
        let found: Vec<i32> = ns
            .processes()
            .iter()
            .map(|p| p.as_raw_nonzero().get())
            .collect();
        assert_eq!(found, vec![pid as i32]);
        assert_eq!(ns.signal_all(Signal::KILL), 1);
        let status = child.wait().expect("wait");
        assert!(!status.success(), "killed: {status:?}");
        assert!(ns.processes().is_empty());
    }
}

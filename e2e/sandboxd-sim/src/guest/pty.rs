//! Pseudo-terminals for the agent's `pty_open` shell: a real pty pair
//! (`/dev/ptmx`), the master read and written asynchronously, the slave as
//! the shell's controlling terminal.

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;

use rustix::fs::{Mode, OFlags};
use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
use rustix::termios::{Winsize, tcsetwinsize};
use tokio::io::unix::AsyncFd;

/// The master side, non-blocking.
#[derive(Debug)]
pub struct PtyMaster {
    fd: AsyncFd<OwnedFd>,
}

/// A fresh pty pair: the master, and the slave to hand to the shell.
pub fn open(cols: u16, rows: u16) -> io::Result<(PtyMaster, File)> {
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    grantpt(&master)?;
    unlockpt(&master)?;
    let name = ptsname(&master, Vec::new())?;
    let slave = rustix::fs::open(
        name.as_c_str(),
        OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    tcsetwinsize(&master, winsize(cols, rows))?;
    rustix::io::ioctl_fionbio(&master, true)?;
    // SAFETY: `master` is an open descriptor owned by the AsyncFd from here
    // on; it stays open and the same until the AsyncFd is dropped.
    let fd = unsafe { AsyncFd::register(master) }?;
    Ok((PtyMaster { fd }, File::from(slave)))
}

/// A size of 0 (absent in the frame) becomes the classic 80×24.
fn winsize(cols: u16, rows: u16) -> Winsize {
    Winsize {
        ws_col: if cols == 0 { 80 } else { cols },
        ws_row: if rows == 0 { 24 } else { rows },
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

impl PtyMaster {
    /// Read what the shell wrote. `Ok(0)` once the slave side is closed
    /// (Linux reports that as EIO).
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard
                .try_io(|fd| rustix::io::read(fd.get_ref(), &mut *buf).map_err(io::Error::from))
            {
                Ok(Ok(n)) => return Ok(n),
                Ok(Err(e)) if e.raw_os_error() == Some(rustix::io::Errno::IO.raw_os_error()) => {
                    return Ok(0);
                }
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }

    /// Type into the terminal.
    pub async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let mut guard = self.fd.writable().await?;
            match guard.try_io(|fd| rustix::io::write(fd.get_ref(), data).map_err(io::Error::from))
            {
                Ok(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(Ok(n)) => data = &data[n..],
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }

    pub fn resize(&self, cols: u16, rows: u16) -> io::Result<()> {
        tcsetwinsize(self.fd.get_ref(), winsize(cols, rows)).map_err(io::Error::from)
    }
}

//! The byte streams a connection runs over: TCP and Unix sockets (or recorded bytes in
//! tests), with reads that time out and, on sockets, wait for enough bytes to arrive at once.

use std::io::{self, Read, Write};
use std::net::TcpStream;
#[cfg(unix)]
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// A byte stream whose reads can time out: a socket, or recorded bytes in tests.
pub trait Stream: Read + Write {
    /// Makes a read that waits longer than `timeout` fail with `WouldBlock` or `TimedOut`.
    fn set_read_timeout(&mut self, timeout: Duration) -> io::Result<()>;

    /// Makes a read wait until at least `bytes` have arrived, or until its timeout, when it
    /// returns what there is (`SO_RCVLOWAT`). A stream that cannot returns as soon as
    /// anything arrives.
    fn set_min_read(&mut self, bytes: usize) -> io::Result<()> {
        let _ = bytes;
        Ok(())
    }
}

impl Stream for TcpStream {
    fn set_read_timeout(&mut self, timeout: Duration) -> io::Result<()> {
        TcpStream::set_read_timeout(self, Some(timeout))
    }

    #[cfg(unix)]
    fn set_min_read(&mut self, bytes: usize) -> io::Result<()> {
        set_rcvlowat(self, bytes)
    }
}

#[cfg(unix)]
impl Stream for UnixStream {
    fn set_read_timeout(&mut self, timeout: Duration) -> io::Result<()> {
        UnixStream::set_read_timeout(self, Some(timeout))
    }

    fn set_min_read(&mut self, bytes: usize) -> io::Result<()> {
        set_rcvlowat(self, bytes)
    }
}

impl<S: Stream + ?Sized> Stream for Box<S> {
    fn set_read_timeout(&mut self, timeout: Duration) -> io::Result<()> {
        (**self).set_read_timeout(timeout)
    }

    fn set_min_read(&mut self, bytes: usize) -> io::Result<()> {
        (**self).set_min_read(bytes)
    }
}

#[cfg(unix)]
fn set_rcvlowat(socket: &impl std::os::fd::AsRawFd, bytes: usize) -> io::Result<()> {
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: the descriptor is the socket's own, and the option value a c_int that outlives
    // the call, its size given.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&raw const value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

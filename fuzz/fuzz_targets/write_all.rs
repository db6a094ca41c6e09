//! Every writer on one profile, into a sink that refuses output past a bound, as a full disk
//! would: the writer must stop at the error. A writer that loops or allocates per unit of count
//! fails the target by libFuzzer's time and memory limits.

use stackscope_profile::format::{self, Format, WriteOptions};
use stackscope_profile::Profile;
use std::io::{self, Write};

/// Output past this is refused. OSDK output is a round per sample, so a few bytes of input
/// may rightly ask for more.
const MAX_OUTPUT: usize = 64 << 20;

struct Bounded(usize);

impl Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.0 + buf.len() > MAX_OUTPUT {
            return Err(io::Error::new(io::ErrorKind::StorageFull, "output bound reached"));
        }
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

pub fn write_all(profile: &Profile) {
    let opts = WriteOptions {
        delimiter: true,
        annotate_kernel: true,
        title: None,
    };
    for format in Format::ALL {
        let _ = format::write(profile, format, &opts, &mut Bounded(0));
    }
}

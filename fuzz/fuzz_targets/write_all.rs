//! Every writer on one profile, into a sink that refuses output past a bound: a writer that
//! writes without end fails the target.

use stackscope_profile::format::{self, Format, WriteOptions};
use stackscope_profile::Profile;
use std::io::{self, Write};

/// More output than any fuzzed input of a few kilobytes should make.
const MAX_OUTPUT: usize = 64 << 20;

struct Bounded(usize);

impl Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len();
        assert!(self.0 <= MAX_OUTPUT, "a writer wrote more than {MAX_OUTPUT} bytes");
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
    for name in Format::NAMES {
        let Some(format) = Format::from_name(name) else {
            continue;
        };
        let _ = format::write(profile, format, &opts, &mut Bounded(0));
    }
}

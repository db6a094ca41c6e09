//! What `stackscope report` does with an input's bytes: refuse it from its start, or detect its
//! format and read it, then write every format of what it read.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stackscope_profile::format;

mod write_all;

fuzz_target!(|data: &[u8]| {
    let start = &data[..data.len().min(format::START_BYTES)];
    if format::check_start(start).is_err() {
        return;
    }
    if let Ok(profile) = format::read(data) {
        write_all::write_all(&profile);
    }
});

//! The folded stacks reader on any bytes, then every writer on what it read: errors, never a
//! panic, a hang or output without end.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stackscope_profile::format::Format;

mod write_all;

fuzz_target!(|data: &[u8]| {
    if let Ok(profile) = stackscope_profile::format::read_as(Format::Folded, data) {
        write_all::write_all(&profile);
    }
});

//! The perf.data reader on any bytes: an error, never a panic or a huge allocation.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stackscope_perf_event::perf_data::read_perf_data_from;
use std::io::Cursor;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let _ = read_perf_data_from(Cursor::new(data), Path::new("fuzz.data"), &mut |_| {});
});

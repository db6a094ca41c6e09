//! MiniDebugInfo (`.gnu_debugdata`, xz) on any bytes, bounded to 1 MiB: what would decompress
//! to more is refused before it is decompressed, and nothing panics.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    stackscope_symbols::fuzzing::mini_debuginfo(data, 1 << 20);
});

//! The sources' hints worded for the command line: each names the flags that would help, so
//! the sources never do. The words are the ones the profile's hints have always carried.

use stackscope_stacks::{Hint, Recording};

/// How to give a program of one's own debug info, wherever one lacks it (a recording's hint,
/// `stackscope doctor`).
pub(crate) const BUILD_WITH_DEBUG_INFO: &str = "build with debug info: for a cargo project, \
    `[profile.release] debug = \"line-tables-only\"` in Cargo.toml (or \
    CARGO_PROFILE_RELEASE_DEBUG=line-tables-only), or `cargo stackscope`, which turns it on; for \
    C or C++, -g";

/// Where the debug info of a distribution's binary comes from.
pub(crate) const INSTALL_DEBUG_INFO: &str = "install the debug info: the -dbgsym (Debian, \
    Ubuntu) or -debuginfo (Fedora) package of the package holding the binary, or set \
    DEBUGINFOD_URLS to a debuginfod server (https://debuginfod.debian.net, \
    https://debuginfod.fedoraproject.org) for stackscope to fetch it";

/// One hint as the profile carries it.
pub(crate) fn sentence(hint: &Hint) -> String {
    match hint {
        Hint::StackCopyShort { share, bytes, max } => format!(
            "{share:.1}% of stacks were deeper than the {bytes}-byte stack copy: raise --stack-size (at most {max})"
        ),
        Hint::ShortChains { share } => format!(
            "{share:.1}% of frame-pointer stacks stop short of their entry point: the code was built without frame pointers; use --unwind dwarf (the default)"
        ),
        Hint::RingFull { lost } => format!(
            "{lost} samples were lost because the ring buffer was full: lower -F or --stack-size"
        ),
        Hint::CountMapFull { dropped, entries } => format!(
            "{dropped} samples were not counted because the count map was full: raise --hash-storage-size (it is {entries})"
        ),
        Hint::StackStorageFull { missed, entries } => format!(
            "{missed} stack traces could not be stored because the kernel's stack storage was full: raise `stackscope profile --stack-storage-size` (it is {entries})"
        ),
        Hint::StackCollisions {
            missed,
            stored,
            buckets,
        } => format!(
            "{missed} stack traces could not be stored because another stack held their hash bucket: the kernel's stack storage keeps one stack per bucket, so {stored} stacks in {buckets} buckets collide now and then long before it is full; a larger `stackscope profile --stack-storage-size` makes it rarer"
        ),
        Hint::NoDebugInfo { binaries, share } => {
            let (has, its) = match binaries.len() {
                1 => ("has", "its"),
                _ => ("have", "their"),
            };
            format!(
                "{share:.1}% of user stacks were sampled in {}, which {has} no debug info, so {its} frames are named without inlined functions or source lines; {BUILD_WITH_DEBUG_INFO}",
                binaries.join(", ")
            )
        }
        Hint::NoSymbols { binaries, share } => {
            let it = match binaries.len() {
                1 => "it",
                _ => "them",
            };
            format!(
                "{share:.1}% of user stacks were sampled in functions no symbol names (shown as module+address), in {}: stripped, and no debug file was found for {it}; {INSTALL_DEBUG_INFO}",
                binaries.join(", ")
            )
        }
        Hint::Said(text) => text.clone(),
    }
}

/// Words the recording's hints into its profile, where the summary and every output format
/// find them.
pub(crate) fn word_hints(recording: &mut Recording) {
    let worded = recording.hints.iter().map(sentence);
    recording.profile.meta.hints.extend(worded);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn naming_hints_name_the_binaries_and_the_fix_for_each_kind() {
        let own = sentence(&Hint::NoDebugInfo {
            binaries: vec!["/src/app/target/release/app".into()],
            share: 98.0,
        });
        assert!(own.contains("/src/app/target/release/app, which has no debug info"));
        assert!(
            own.contains("debug = \"line-tables-only\"") && own.contains("-g"),
            "{own}"
        );
        assert!(own.contains("cargo stackscope"), "{own}");
        let stripped = sentence(&Hint::NoSymbols {
            binaries: vec!["/usr/bin/xz".into(), "/usr/lib/liblzma.so.5".into()],
            share: 90.0,
        });
        assert!(stripped.contains("in /usr/bin/xz, /usr/lib/liblzma.so.5"));
        assert!(
            stripped.contains("-dbgsym") && stripped.contains("DEBUGINFOD_URLS"),
            "{stripped}"
        );
    }
}

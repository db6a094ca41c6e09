//! What a source tells the user about stacks that are not whole, samples that are missing or
//! frames that are named less than they could be, in the source's own terms: the figures and
//! what ran short. The caller words each hint with its own options (a command line's flags),
//! so no source names them.

use std::sync::Arc;

use stackscope_symbols::unwind_sources;

use crate::table::{original_path, ModuleUse, Tally, PAST_KEPT_STACKS, STACKS_KEPT};

/// One thing the user could change to get whole stacks or every sample.
#[derive(Debug, Clone, PartialEq)]
pub enum Hint {
    /// `share` percent of user stacks were deeper than the `bytes` of stack copied per
    /// sample, which can be raised up to `max` bytes.
    StackCopyShort { share: f64, bytes: u32, max: u32 },
    /// `share` percent of frame-pointer stacks stop short of their entry point: the code was
    /// built without frame pointers, and unwinding with DWARF would walk it.
    ShortChains { share: f64 },
    /// `lost` samples were lost because the ring buffer was full: sampling less often or
    /// copying less stack per sample would keep them.
    RingFull { lost: u64 },
    /// `dropped` samples were not counted because the count map, of `entries`, was full.
    CountMapFull { dropped: u64, entries: u32 },
    /// `missed` stacks could not be stored because the stack storage, of `entries` stacks,
    /// was full.
    StackStorageFull { missed: u64, entries: u32 },
    /// `missed` stacks could not be stored because another stack held their hash bucket in
    /// the kernel's stack storage, which keeps one stack per bucket: with `stored` stacks in
    /// `buckets` buckets, two share one long before the storage is full. More buckets make it
    /// rarer.
    StackCollisions {
        missed: u64,
        stored: u64,
        buckets: u64,
    },
    /// `share` percent of user stacks were sampled in the code of `binaries` (paths, the most
    /// sampled first), programs of the user's own (not installed where a distribution puts
    /// its files) without debug info: their frames are named from their symbol tables,
    /// without inlined functions or source lines.
    NoDebugInfo { binaries: Vec<String>, share: f64 },
    /// `share` percent of user stacks were sampled in functions no symbol names (shown as
    /// module+address), in `binaries` (paths, the most sampled first): stripped binaries whose
    /// debug info was found nowhere.
    NoSymbols { binaries: Vec<String>, share: f64 },
    /// A hint that names none of the caller's options, worded by the source.
    Said(String),
}

/// The share of user stacks (in percent) a binary's naming must touch before a hint names
/// it: below it, what its names lack changes little of the profile.
const NAMING_SHARE: f64 = 5.0;

/// Binaries a naming hint names at most.
const NAMED: usize = 3;

/// Where distributions and their package managers put their files: debug info for those comes
/// in packages or from debuginfod, not from a build of one's own. `/usr/local` is the
/// administrator's.
const SYSTEM_DIRS: &[&str] = &[
    "/usr/",
    "/lib/",
    "/lib32/",
    "/lib64/",
    "/libx32/",
    "/bin/",
    "/sbin/",
    "/opt/",
    "/snap/",
    "/nix/store/",
    "/gnu/store/",
];

/// What limits the names of the frames `tally` counted: code sampled in functions no symbol
/// names ([`Hint::NoSymbols`]), programs of the user's own named without debug info
/// ([`Hint::NoDebugInfo`]), as `stackscope doctor` tells a binary without it, and stacks
/// kept as their leaf alone past a live view's bound.
pub fn naming_hints(tally: &Tally) -> Vec<Hint> {
    let mut hints = Vec::new();
    if tally.past_kept_stacks > 0 {
        hints.push(Hint::Said(format!(
            "{} samples came in new stacks once {} distinct stacks were kept: each is counted as its innermost function alone under {} (its own time whole, its callers not kept)",
            tally.past_kept_stacks,
            STACKS_KEPT,
            PAST_KEPT_STACKS
        )));
    }
    let whole = tally.stats.user_stacks;
    if whole == 0 {
        return hints;
    }
    let share = |n: u64| n as f64 * 100.0 / whole as f64;

    // Named as the user knows them: a copy in perf's build-id cache by its original's path.
    let named = |binaries: &[(&Arc<str>, u64)]| -> Vec<String> {
        binaries
            .iter()
            .take(NAMED)
            .map(|m| original_path(m.0).to_string())
            .collect()
    };

    let unnamed = most_first(tally, |_, used| used.unnamed_leaf);
    let in_unnamed: u64 = unnamed.iter().map(|m| m.1).sum();
    if share(in_unnamed) >= NAMING_SHARE {
        hints.push(Hint::NoSymbols {
            binaries: named(&unnamed),
            share: share(in_unnamed),
        });
    }

    let bare: Vec<(&Arc<str>, u64)> = most_first(tally, |path, used| {
        let own = !used.lines && !installed_by_system(original_path(path));
        match own {
            true => used.leaf - used.unnamed_leaf,
            false => 0,
        }
    })
    .into_iter()
    .filter(|m| share(m.1) >= NAMING_SHARE)
    .filter(|m| unwind_sources(std::path::Path::new(&**m.0)).is_ok_and(|s| !s.debug_info))
    .take(NAMED)
    .collect();
    if !bare.is_empty() {
        hints.push(Hint::NoDebugInfo {
            binaries: named(&bare),
            share: share(bare.iter().map(|m| m.1).sum()),
        });
    }
    hints
}

/// The modules `tally` counted with the samples `count` gives each, most first, those with
/// none left out.
fn most_first(tally: &Tally, count: impl Fn(&str, &ModuleUse) -> u64) -> Vec<(&Arc<str>, u64)> {
    let mut counted: Vec<(&Arc<str>, u64)> = tally
        .modules
        .iter()
        .map(|(path, used)| (path, count(path, used)))
        .filter(|m| m.1 > 0)
        .collect();
    counted.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    counted
}

/// Whether `path` lies where a distribution installs its files.
fn installed_by_system(path: &str) -> bool {
    !path.starts_with("/usr/local/") && SYSTEM_DIRS.iter().any(|dir| path.starts_with(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_files_are_told_from_builds_of_ones_own() {
        for system in [
            "/usr/bin/xz",
            "/lib/x86_64-linux-gnu/liblzma.so.5",
            "/opt/google/chrome/chrome",
            "/nix/store/abc-hello/bin/hello",
        ] {
            assert!(installed_by_system(system), "{system}");
        }
        for own in [
            "/usr/local/bin/mytool",
            "/home/me/app/target/release/app",
            "/tmp/x/prog",
            "/library/prog",
        ] {
            assert!(!installed_by_system(own), "{own}");
        }
    }

    #[test]
    fn stripped_code_is_named_by_share_most_sampled_first() {
        let mut tally = Tally::default();
        tally.stats.user_stacks = 100;
        let used = |leaf, unnamed_leaf| ModuleUse {
            leaf,
            unnamed_leaf,
            lines: false,
        };
        tally.modules.insert("/usr/bin/xz".into(), used(10, 10));
        tally
            .modules
            .insert("/usr/lib/liblzma.so.5".into(), used(80, 80));
        tally
            .modules
            .insert("/usr/lib/libc.so.6".into(), used(10, 0));
        assert_eq!(
            naming_hints(&tally),
            [Hint::NoSymbols {
                binaries: vec!["/usr/lib/liblzma.so.5".into(), "/usr/bin/xz".into()],
                share: 90.0
            }]
        );
        // A few unnamed samples are no hint.
        tally
            .modules
            .insert("/usr/lib/liblzma.so.5".into(), used(80, 0));
        tally.modules.insert("/usr/bin/xz".into(), used(10, 4));
        assert_eq!(naming_hints(&tally), []);
    }
}

//! The sources' hints worded for the command line: each names the flags that would help, so
//! the sources never do. The words are the ones the profile's hints have always carried. And
//! the one hint no source can give, since only the command knows what it sampled: a target
//! that spent most of its time off the CPU.

use stackscope_profile::{CountUnit, Profile};
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

/// The share of the time recorded a target sampled on the CPU must have spent there, below
/// which it is said to have spent most of it off the CPU. Low enough that a busy program on a
/// loaded machine, waiting for a CPU a good part of the time, stays above it.
const MOSTLY_OFF_CPU: f64 = 0.2;

/// Recordings shorter than this say nothing of time off the CPU: a short command's start-up
/// (exec, the loader) is too little time to judge.
const OFF_CPU_MIN_SECS: f64 = 1.0;

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

/// The hint for a target sampled on the CPU that spent most of the recording off it, where a
/// profile of time would show where it waited; `None` for one that did not, or a profile that
/// does not count CPU time.
pub(crate) fn off_cpu(profile: &Profile) -> Option<String> {
    let meta = &profile.meta;
    if meta.count_unit != CountUnit::Samples || meta.event != "cpu-clock" {
        return None;
    }
    let nanos = meta.sample_nanos()?;
    let recorded = meta.duration_secs;
    if recorded < OFF_CPU_MIN_SECS {
        return None;
    }
    let on_cpu = profile.total_samples() as f64 * nanos as f64 / 1e9;
    (on_cpu < MOSTLY_OFF_CPU * recorded).then(|| {
        format!(
            "the target was on a CPU for {on_cpu:.2} s of the {recorded:.1} s recorded ({:.0}%); the rest of the time it slept, blocked on I/O or a lock, or waited for a CPU, which samples of CPU time do not see: `--off-cpu` counts where it was off the CPU, `--wall` both",
            on_cpu * 100.0 / recorded
        )
    })
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
    use stackscope_profile::{Metadata, ProfileBuilder, Thread};

    /// A profile of `samples` cpu-clock samples at 1000 Hz over `secs`.
    fn sampled(samples: u64, secs: f64) -> Profile {
        let mut b = ProfileBuilder::new(Metadata {
            event: "cpu-clock".into(),
            frequency_hz: Some(1000),
            duration_secs: secs,
            ..Metadata::default()
        });
        let t = b.thread(Thread::default());
        let s = b.stack(&[]);
        b.add(t, s, None, samples);
        b.finish()
    }

    #[test]
    fn a_target_mostly_off_the_cpu_is_pointed_to_time_profiles() {
        let hint = off_cpu(&sampled(40, 2.0)).expect("a hint for 2% on the CPU");
        assert!(hint.contains("0.04 s of the 2.0 s recorded (2%)"), "{hint}");
        assert!(
            hint.contains("--off-cpu") && hint.contains("--wall"),
            "{hint}"
        );
        // A busy target on a loaded machine, on a CPU a third of the time.
        assert_eq!(off_cpu(&sampled(700, 2.0)), None);
        // Too short a recording to judge.
        assert_eq!(off_cpu(&sampled(0, 0.5)), None);
        // A profile of time, or of probe hits, is no matter for it.
        let mut probes = sampled(10, 2.0);
        probes.meta.event = "uprobe:libc:malloc".into();
        assert_eq!(off_cpu(&probes), None);
        let mut time = sampled(10, 2.0);
        time.meta.count_unit = CountUnit::Microseconds;
        assert_eq!(off_cpu(&time), None);
    }

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

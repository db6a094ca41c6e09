//! Our folded output fed to a real consumer, inferno's folded reader: every line must be
//! accepted. inferno skips lines it cannot parse with only a logged warning, so this binary
//! installs a logger that records warnings, and also checks the sample total inferno drew.

mod fixture;

use stackscope_profile::format::{write, Format, WriteOptions};
use stackscope_profile::{Frame, FrameKind, Metadata, ProfileBuilder, Thread};
use std::sync::Mutex;

static WARNINGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Recorder;

impl log::Log for Recorder {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::Level::Warn
    }
    fn log(&self, record: &log::Record) {
        if self.enabled(record.metadata()) {
            WARNINGS.lock().unwrap().push(record.args().to_string());
        }
    }
    fn flush(&self) {}
}

static RECORDER: Recorder = Recorder;

/// Renders `folded` with inferno; returns the warnings it logged and the SVG.
fn consume(folded: &str) -> (Vec<String>, String) {
    // Both tests share the logger; only one may be inside inferno at a time.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _guard = ONE_AT_A_TIME.lock().unwrap();
    let _ = log::set_logger(&RECORDER);
    log::set_max_level(log::LevelFilter::Warn);
    WARNINGS.lock().unwrap().clear();
    let mut options = inferno::flamegraph::Options::default();
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut options, folded.lines(), &mut svg)
        .unwrap_or_else(|e| panic!("inferno rejected our folded output: {e}\n{folded}"));
    let warnings = std::mem::take(&mut *WARNINGS.lock().unwrap());
    (warnings, String::from_utf8(svg).unwrap())
}

fn folded(profile: &stackscope_profile::Profile, delimiter: bool, annotate_kernel: bool) -> String {
    let opts = WriteOptions {
        delimiter,
        annotate_kernel,
        title: None,
    };
    let mut out = Vec::new();
    write(profile, Format::Folded, &opts, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

#[test]
fn inferno_accepts_every_line() {
    let profile = fixture::profile();
    let total = profile.total_samples();
    for (delimiter, annotate_kernel) in [(false, false), (true, true)] {
        let text = folded(&profile, delimiter, annotate_kernel);
        let (warnings, svg) = consume(&text);
        assert!(warnings.is_empty(), "inferno warned: {warnings:?}\n{text}");
        assert!(
            svg.contains(&format!("<title>all ({total} samples, 100%)</title>")),
            "inferno drew another total than {total}"
        );
    }
}

#[test]
fn the_logger_sees_a_rejected_line() {
    // Proves the check above can fail: inferno must warn about a line without a count.
    let (warnings, _) = consume("a;b 1\na;c\n");
    assert!(
        warnings.iter().any(|w| w.contains("Ignored 1 lines")),
        "{warnings:?}"
    );
}

#[test]
fn hostile_names_stay_one_frame_each() {
    let mut b = ProfileBuilder::new(Metadata::default());
    let names = [
        "std::array<u8; 8>",
        "two\nlines",
        "carriage\rreturn",
        "trailing 12",
        "",
    ];
    let frames: Vec<u32> = names
        .iter()
        .map(|n| {
            b.frame(Frame {
                name: n.to_string(),
                kind: FrameKind::User,
                ..Frame::default()
            })
        })
        .collect();
    let thread = b.thread(Thread {
        pid: 1,
        tid: 1,
        comm: "semi;colon".to_string(),
        process_name: String::new(),
    });
    for i in 1..=frames.len() {
        let stack = b.stack(&frames[..i]);
        b.add(thread, stack, None, i as u64);
    }
    let profile = b.finish();
    let text = folded(&profile, false, false);
    assert_eq!(text.lines().count(), names.len());
    for line in text.lines() {
        let (stack, _) = line.rsplit_once(' ').unwrap();
        // comm plus however many frames this line's stack has
        let depth = line.rsplit_once(' ').unwrap().1.parse::<usize>().unwrap();
        assert_eq!(stack.split(';').count(), 1 + depth, "{line}");
    }
    let (warnings, svg) = consume(&text);
    assert!(warnings.is_empty(), "{warnings:?}\n{text}");
    let total = profile.total_samples();
    assert!(svg.contains(&format!("<title>all ({total} samples, 100%)</title>")));
    // Not read as a differential count column.
    assert!(svg.contains("<title>trailing_12 ("), "{text}");
    assert!(text.contains(";trailing_12 4\n"), "{text}");
}

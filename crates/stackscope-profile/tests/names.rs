//! Names a profiled process or a saved file chose, hostile ones included, through every writer:
//! no control character reaches any output, every JSON output parses, and folded stacks read
//! back as they were written.

use flate2::read::GzDecoder;
use prost::Message;
use stackscope_profile::format::pprof::proto;
use stackscope_profile::format::{read, write, Format, ReadError, WriteOptions};
use stackscope_profile::{Frame, FrameKind, Metadata, Profile, ProfileBuilder, Thread};
use std::io::Read;

/// What a process can put in its name (`prctl(PR_SET_NAME)`) or a symbol table in a function's:
/// a terminal escape, C0 and C1 controls, NUL, DEL, XML's specials and folded's separators.
const HOSTILE: &str = "\x1b[31mevil\x01;x\nnext\0nul\r\t<&>\"'\x7f\u{85}\u{fffe}";

/// The characters no writer but stackscope's JSON (which escapes them) may let through.
fn unprintable(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t') || c == '\u{fffe}' || c == '\u{ffff}'
}

/// One thread per comm in `comms`, and a sample per stack in `stacks` (frame names, root
/// first), the i-th counted i + 1 times so every line is told apart by its count.
fn profile_of(comm: &str, stacks: &[Vec<&str>]) -> Profile {
    let mut b = ProfileBuilder::new(Metadata {
        event: "cpu-clock".to_string(),
        ..Metadata::default()
    });
    let thread = b.thread(Thread {
        pid: 7,
        tid: 7,
        comm: comm.to_string(),
        process_name: comm.to_string(),
    });
    for (i, names) in stacks.iter().enumerate() {
        let ids: Vec<u32> = names
            .iter()
            .map(|name| {
                b.frame(Frame {
                    name: name.to_string(),
                    module: Some(format!("/tmp/lib{name}.so")),
                    ..Frame::default()
                })
            })
            .collect();
        let stack = b.stack(&ids);
        b.add(thread, stack, Some(0), i as u64 + 1);
    }
    b.finish()
}

fn render(profile: &Profile, format: Format) -> Vec<u8> {
    let opts = WriteOptions {
        title: Some(format!("title {HOSTILE}")),
        ..WriteOptions::default()
    };
    let mut out = Vec::new();
    write(profile, format, &opts, &mut out).unwrap();
    out
}

#[test]
fn no_writer_lets_a_control_character_of_a_name_through() {
    let profile = profile_of(HOSTILE, &[vec!["main", HOSTILE], vec![HOSTILE]]);
    for format in Format::ALL {
        let bytes = render(&profile, format);
        let text = match format {
            Format::Pprof => {
                let mut raw = Vec::new();
                GzDecoder::new(&bytes[..]).read_to_end(&mut raw).unwrap();
                let message = proto::Profile::decode(raw.as_slice()).unwrap();
                message.string_table.join("\n")
            }
            _ => String::from_utf8(bytes).unwrap(),
        };
        if matches!(
            format,
            Format::Json | Format::Speedscope | Format::Firefox | Format::Osdk
        ) {
            let value: serde_json::Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{format} is not JSON: {e}"));
            // JSON escapes control characters; only stackscope's own format keeps them.
            let strings = strings_in(&value);
            let kept = strings.iter().any(|s| s.contains('\x1b'));
            assert_eq!(kept, format == Format::Json, "{format}: {strings:?}");
            if format != Format::Json {
                assert!(
                    strings.iter().all(|s| !s.chars().any(unprintable)),
                    "{format}: {strings:?}"
                );
            }
            continue;
        }
        assert!(
            !text.chars().any(unprintable),
            "{format} holds a control character:\n{text:?}"
        );
        assert!(
            text.contains("\u{fffd}[31mevil\u{fffd}"),
            "{format} does not show the replaced name:\n{text}"
        );
    }
}

fn strings_in(value: &serde_json::Value) -> Vec<String> {
    match value {
        serde_json::Value::String(s) => vec![s.clone()],
        serde_json::Value::Array(items) => items.iter().flat_map(strings_in).collect(),
        serde_json::Value::Object(map) => map
            .iter()
            .flat_map(|(k, v)| {
                let mut all = vec![k.clone()];
                all.extend(strings_in(v));
                all
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// The folded lines of `profile`, and what reading them back gives written again.
fn folded_twice(profile: &Profile) -> (String, Profile, String) {
    let first = String::from_utf8(render(profile, Format::Folded)).unwrap();
    let back = read(first.as_bytes()).unwrap_or_else(|e| panic!("{e}:\n{first}"));
    let second = String::from_utf8(render(&back, Format::Folded)).unwrap();
    (first, back, second)
}

/// The frame names of the sample counted `count`, root first.
fn stack_counted(profile: &Profile, count: u64) -> Vec<&str> {
    let sample = profile.samples.iter().find(|s| s.count == count).unwrap();
    profile
        .stack_frames(sample.stack)
        .map(|f| f.name.as_str())
        .collect()
}

#[test]
fn folded_names_read_back_as_they_were_written() {
    // (name, as folded writes it), each as a middle frame and as the leaf.
    let cases = [
        (HOSTILE, "\u{fffd}[31mevil\u{fffd}:x\u{fffd}next\u{fffd}nul\u{fffd}\u{fffd}<&>\"'\u{fffd}\u{fffd}\u{fffd}"),
        ("a;b", "a:b"),
        ("nul\0byte", "nul\u{fffd}byte"),
        ("  padded  ", "padded"),
        ("tab\tend\t", "tab\u{fffd}end\u{fffd}"),
        ("-", "\u{fffd}"),
        ("", "[unknown]"),
        ("# not a comment", "# not a comment"),
        ("spaced 12", "spaced 12"),
    ];
    let mut stacks = Vec::new();
    for (name, _) in cases {
        stacks.push(vec!["main", name, "leaf"]);
        stacks.push(vec!["main", name]);
    }
    let profile = profile_of("prog", &stacks);
    let (first, back, second) = folded_twice(&profile);
    assert_eq!(first, second, "folded text does not read back as itself");
    assert_eq!(back.total_samples(), profile.total_samples());
    assert_eq!(back.samples.len(), profile.samples.len(), "{first}");
    for (i, (name, written)) in cases.iter().enumerate() {
        let middle = stack_counted(&back, 2 * i as u64 + 1);
        assert_eq!(middle, ["main", written, "leaf"], "{name:?} in the middle");
        // A leaf ending in ` 12` is guarded so it is not taken for a second count.
        let leaf = written.replace(" 12", "_12");
        assert_eq!(
            stack_counted(&back, 2 * i as u64 + 2),
            ["main", leaf.as_str()],
            "{name:?} as the leaf"
        );
    }
}

#[test]
fn folded_command_names_read_back_as_they_were_written() {
    // (comm, as folded writes it): a comm could make the line a comment, or the file JSON.
    let cases = [
        (HOSTILE, "\u{fffd}[31mevil\u{fffd}:x\u{fffd}next\u{fffd}nul\u{fffd}\u{fffd}<&>\"'\u{fffd}\u{fffd}\u{fffd}"),
        ("# hidden", "\u{fffd} hidden"),
        ("{\"format\":1}", "\u{fffd}\"format\":1}"),
        ("{ }", "\u{fffd} }"),
        ("{x", "{x"),
        (" lead", "lead"),
        ("", "[unknown]"),
        ("-", "\u{fffd}"),
    ];
    for (comm, written) in cases {
        let profile = profile_of(comm, &[vec!["main", "work"]]);
        let (first, back, second) = folded_twice(&profile);
        assert_eq!(first, second, "{comm:?}");
        assert_eq!(back.total_samples(), 1, "{comm:?}: {first}");
        assert_eq!(back.threads[0].comm, written, "{comm:?}");
        assert_eq!(stack_counted(&back, 1), ["main", "work"], "{comm:?}");
    }
}

#[test]
fn every_ascii_character_in_a_name_reads_back_from_folded() {
    let names: Vec<String> = (0u8..128)
        .map(|b| format!("f{}g", b as char))
        .chain((0u8..128).map(|b| format!("{}", b as char)))
        .collect();
    let stacks: Vec<Vec<&str>> = names.iter().map(|n| vec![n.as_str(), "x"]).collect();
    let profile = profile_of("p", &stacks);
    let (first, back, second) = folded_twice(&profile);
    assert_eq!(first, second);
    assert_eq!(back.total_samples(), profile.total_samples(), "{first}");
    assert!(back
        .frames
        .iter()
        .all(|f| f.kind != FrameKind::Kernel && !f.name.chars().any(unprintable)));
}

#[test]
fn differential_folded_lines_are_refused_not_misnamed() {
    // As `stackscope diff` and inferno-diff-folded write them: `stack BEFORE AFTER`.
    for text in ["prog;main;foo 6 7\n", "prog;main 1 2\nprog;main;a 0 3\n"] {
        match read(text.as_bytes()) {
            Err(e @ ReadError::Differential { line: 1 }) => {
                let message = e.to_string();
                assert!(!message.contains('\n'), "{message}");
                assert!(message.contains("differential folded stacks"), "{message}");
            }
            other => panic!("{text:?} read as {other:?}"),
        }
    }
    // A name that only ends in a word of digits and dots that is no count reads as a name.
    let p = read(b"prog;main;v1.2.3 4\n").unwrap();
    assert_eq!(stack_counted(&p, 4), ["main", "v1.2.3"]);
}

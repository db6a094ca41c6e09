//! The reader on corrupt, truncated and foreign input: an error that says what and where,
//! never a panic.

mod fixture;

use stackscope_profile::format::{read, write, Format, ReadError, WriteOptions};

fn json() -> String {
    let mut out = Vec::new();
    write(
        &fixture::profile(),
        Format::Json,
        &WriteOptions::default(),
        &mut out,
    )
    .unwrap();
    String::from_utf8(out).unwrap()
}

fn folded() -> String {
    let mut out = Vec::new();
    let opts = WriteOptions {
        delimiter: true,
        annotate_kernel: true,
        title: None,
    };
    write(&fixture::profile(), Format::Folded, &opts, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn error(input: &str) -> String {
    let e = read(input.as_bytes()).expect_err(input);
    let message = e.to_string();
    assert!(!message.contains('\n'), "multi-line error: {message}");
    message
}

#[test]
fn every_truncation_of_json_is_an_error() {
    let json = json();
    // Cut everywhere but past the closing brace (the trailing newline is optional).
    let end = json.trim_end().len();
    for cut in 1..end {
        if !json.is_char_boundary(cut) {
            continue;
        }
        match read(&json.as_bytes()[..cut]) {
            Err(ReadError::Json { .. }) => {}
            other => panic!("cut at {cut} of {end}: {other:?}"),
        }
    }
    assert!(read(json.trim_end().as_bytes()).is_ok());
}

#[test]
fn truncated_json_says_so() {
    let json = json();
    let message = error(&json[..json.len() / 2]);
    assert!(message.contains("truncated"), "{message}");
    assert!(message.contains("line 1 column"), "{message}");
}

#[test]
fn json_index_out_of_range() {
    let json = json();
    let cases = [
        // A stack that names a frame that does not exist.
        (
            r#""stacks":[{"frames":[0,1,2,3,4]}"#,
            r#""stacks":[{"frames":[0,1,2,3,99]}"#,
            "profile.stacks[0].frames[4]: frame id 99 is out of range (the profile has 18 frames)",
        ),
        (
            r#"{"thread":1,"stack":3,"#,
            r#"{"thread":1,"stack":7,"#,
            "profile.samples[4].stack: stack id 7 is out of range (the profile has 7 stacks)",
        ),
        (
            r#"{"thread":2,"stack":6,"#,
            r#"{"thread":3,"stack":6,"#,
            "profile.samples[7].thread: thread id 3 is out of range (the profile has 3 threads)",
        ),
    ];
    for (from, to, expected) in cases {
        assert!(json.contains(from), "fixture changed: {from}");
        let message = error(&json.replacen(from, to, 1));
        assert_eq!(message, format!("stackscope JSON, {expected}"));
    }
}

#[test]
fn json_counts_that_overflow() {
    let json = json().replacen(r#""count":7"#, &format!(r#""count":{}"#, u64::MAX), 1);
    let message = error(&json);
    assert!(message.contains("more than 2^64"), "{message}");
}

#[test]
fn json_of_an_unknown_version_or_format() {
    let json = json();
    let message = error(&json.replacen(r#""version":1"#, r#""version":2"#, 1));
    assert!(message.contains("version 2 is not supported"), "{message}");
    let message = error(&json.replacen(r#""format":"stackscope""#, r#""format":"speedscope""#, 1));
    assert!(message.contains("not a stackscope profile"), "{message}");
    // (A first key of "stack_traces" would make it the OSDK's JSON, which reads.)
    let message = error(r#"{"traceEvents":[{"name":"leaf"}]}"#);
    assert!(message.contains("format: missing"), "{message}");
}

#[test]
fn json_with_a_wrong_type() {
    let json = json().replacen(r#""pid":4242"#, r#""pid":"4242""#, 1);
    let message = error(&json);
    assert!(
        message.starts_with("stackscope JSON, line 1 column "),
        "{message}"
    );
    assert!(message.contains("invalid type"), "{message}");
}

#[test]
fn folded_errors_name_the_line() {
    let good = folded();
    let lines: Vec<&str> = good.lines().collect();
    let with = |bad: &str| {
        let mut text = lines[..3].join("\n");
        text.push('\n');
        text.push_str(bad);
        text.push('\n');
        text.push_str(&lines[3..].join("\n"));
        error(&text)
    };
    let cases = [
        (
            "worker;main;compute",
            "line 4: expected `comm;frame;... COUNT`",
        ),
        (
            "worker;main;compute x12",
            "line 4: expected a whole sample count",
        ),
        (
            "worker;main;compute 1.5",
            "line 4: expected a whole sample count",
        ),
        (
            "worker;main;compute -3",
            "line 4: expected a whole sample count",
        ),
        (
            "worker;main;compute 99999999999999999999",
            "line 4: sample count 99999999999999999999 does not fit in 64 bits",
        ),
        (
            "worker;main;;compute 3",
            "line 4: frame 2 has an empty name",
        ),
        (
            ";main 3",
            "line 4: the first field, the command name, is empty",
        ),
    ];
    for (bad, expected) in cases {
        let message = with(bad);
        assert!(
            message.starts_with(&format!("folded stacks, {expected}")),
            "{bad:?}: {message}"
        );
    }
}

#[test]
fn folded_counts_that_overflow() {
    let text = format!("a;b {}\na;b 1\n", u64::MAX);
    assert_eq!(
        error(&text),
        "folded stacks, line 2: the sample counts add up to more than 2^64"
    );
}

#[test]
fn every_truncation_of_folded_reads_or_names_a_line() {
    // A cut inside a line leaves a partial last line: it either still parses (the cut fell
    // inside the count) or is reported on the last line. Never a panic.
    let text = folded();
    let last_line = |s: &str| s.lines().count();
    for cut in 0..text.len() {
        if !text.is_char_boundary(cut) {
            continue;
        }
        let part = &text[..cut];
        match read(part.as_bytes()) {
            Ok(_) => {}
            Err(ReadError::Folded { line, .. }) => {
                assert_eq!(line, last_line(part), "cut at {cut}")
            }
            Err(e) => panic!("cut at {cut}: {e}"),
        }
    }
}

#[test]
fn binary_input() {
    let message = read(b"\x7fELF\x02\x01\x01\x00\xff\xfe")
        .unwrap_err()
        .to_string();
    assert_eq!(
        message,
        "input is not UTF-8 text (bad byte at offset 8); expected stackscope JSON or folded stacks"
    );
}

#[test]
fn writers_refuse_an_invalid_profile() {
    let mut p = fixture::profile();
    p.samples[0].stack = 1000;
    for format in [Format::Folded, Format::Bcc, Format::Svg, Format::Json] {
        let e = write(&p, format, &WriteOptions::default(), &mut Vec::new()).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("samples[0].stack"), "{e}");
    }
}

//! Golden-file tests of the text writers, and round trips through real files.

mod fixture;

use fixture::check_golden;
use stackscope_profile::format::{read, write, Format, WriteOptions};
use stackscope_profile::{FrameKind, Profile};

fn render(profile: &Profile, format: Format, delimiter: bool, annotate_kernel: bool) -> String {
    let opts = WriteOptions {
        delimiter,
        annotate_kernel,
        title: None,
    };
    let mut out = Vec::new();
    write(profile, format, &opts, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

#[test]
fn folded_golden() {
    let p = fixture::profile();
    check_golden("profile.folded", &render(&p, Format::Folded, false, false));
    check_golden("profile-d.folded", &render(&p, Format::Folded, true, false));
    check_golden("profile-a.folded", &render(&p, Format::Folded, false, true));
    check_golden("profile-ad.folded", &render(&p, Format::Folded, true, true));
}

#[test]
fn bcc_golden() {
    let p = fixture::profile();
    check_golden("profile.txt", &render(&p, Format::Bcc, false, false));
    check_golden("profile-ad.txt", &render(&p, Format::Bcc, true, true));
}

#[test]
fn top_golden() {
    check_golden(
        "profile.top.txt",
        &render(&fixture::profile(), Format::Top, false, false),
    );
}

#[test]
fn json_golden() {
    check_golden(
        "profile.json",
        &render(&fixture::profile(), Format::Json, false, false),
    );
}

#[test]
fn folded_sorted_by_count_then_text() {
    let text = render(&fixture::profile(), Format::Folded, false, false);
    let keys: Vec<(u64, &str)> = text
        .lines()
        .map(|l| {
            let (stack, count) = l.rsplit_once(' ').unwrap();
            (count.parse().unwrap(), stack)
        })
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
    // The hot stack, sampled on two CPUs, is one line.
    assert!(text.contains("\nworker;_start;__libc_start_main;main;compute;square 12\n"));
}

#[test]
fn empty_profile_writes_nothing_in_text_formats() {
    let p = Profile::default();
    assert_eq!(render(&p, Format::Folded, true, true), "");
    assert_eq!(render(&p, Format::Bcc, true, true), "");
}

#[test]
fn json_round_trip_through_a_file() {
    let p = fixture::profile();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("profile.json");
    let mut file = std::fs::File::create(&path).unwrap();
    write(&p, Format::Json, &WriteOptions::default(), &mut file).unwrap();
    drop(file);

    let bytes = std::fs::read(&path).unwrap();
    let back = read(&bytes).unwrap();
    assert_eq!(back, p);
    let mut again = Vec::new();
    write(&back, Format::Json, &WriteOptions::default(), &mut again).unwrap();
    assert_eq!(again, bytes);
}

#[test]
fn folded_round_trip_through_a_file() {
    let p = fixture::profile();
    let dir = tempfile::tempdir().unwrap();
    for (delimiter, annotate_kernel) in [(false, false), (true, false), (false, true), (true, true)]
    {
        let text = render(&p, Format::Folded, delimiter, annotate_kernel);
        let path = dir.path().join("profile.folded");
        std::fs::write(&path, &text).unwrap();
        let back = read(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(back.total_samples(), p.total_samples());
        assert_eq!(
            render(&back, Format::Folded, delimiter, annotate_kernel),
            text,
            "delimiter {delimiter}, annotate_kernel {annotate_kernel}"
        );
    }
}

#[test]
fn folded_reader_recovers_kernel_frames() {
    let text = render(&fixture::profile(), Format::Folded, true, true);
    let back = read(text.as_bytes()).unwrap();
    let kernel: Vec<&str> = back
        .frames
        .iter()
        .filter(|f| f.kind == FrameKind::Kernel)
        .map(|f| f.name.as_str())
        .collect();
    assert!(kernel.contains(&"ksys_read"), "{kernel:?}");
    assert!(kernel.contains(&"[unknown]"), "{kernel:?}");
    assert!(!kernel.contains(&"read"), "{kernel:?}");
    assert!(back.frames.iter().all(|f| !f.name.ends_with("_[k]")));
    assert!(back.frames.iter().all(|f| f.name != "-"));
    let markers: Vec<&str> = back
        .frames
        .iter()
        .filter(|f| f.kind == FrameKind::Marker)
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(markers.len(), 2, "{markers:?}");
    assert!(markers.contains(&"[truncated]") && markers.contains(&"[Missed User Stack]"));
    // One thread per comm, the first field.
    let mut comms: Vec<&str> = back.threads.iter().map(|t| t.comm.as_str()).collect();
    comms.sort();
    assert_eq!(comms, ["swapper/0", "worker", "worker-io"]);
}

#[test]
fn folded_reader_merges_equal_lines_and_skips_blank_ones() {
    let text = "\n# a comment\nmain;a;b 3\r\n\nmain;a;b 4\nmain;a 1\n";
    let p = read(text.as_bytes()).unwrap();
    let mut out = Vec::new();
    write(&p, Format::Folded, &WriteOptions::default(), &mut out).unwrap();
    assert_eq!(String::from_utf8(out).unwrap(), "main;a 1\nmain;a;b 7\n");
}

#[test]
fn bcc_layout() {
    let text = render(&fixture::profile(), Format::Bcc, true, false);
    // The syscall stack: kernel leaf first, `--`, user leaf first, process line, count.
    let expected = "    ksys_read\n    __x64_sys_read\n    entry_SYSCALL_64\n    --\n    read\n    main\n    __libc_start_main\n    _start\n    -                worker (4242)\n        4\n\n";
    assert!(text.contains(expected), "{text}");
    // No delimiter where a stack has only kernel frames.
    assert!(text
        .contains("    secondary_startup_64\n    -                swapper/0 (0)\n        5\n\n"));
}

//! The flamegraph SVG, parsed back with a real XML parser.

mod fixture;

use quick_xml::events::Event;
use quick_xml::Reader;
use stackscope_profile::format::{write, Format, WriteOptions};
use stackscope_profile::Profile;

/// What a flamegraph shows: each frame box's `<title>` with its fill, and all text.
struct Parsed {
    /// (title, fill of the box) per frame box, e.g. ("main (4 samples, 12.90%)", "rgb(..)").
    boxes: Vec<(String, String)>,
    /// The text of every `<text>` element.
    texts: Vec<String>,
}

/// Parses `svg` as XML, failing on any syntax error or mismatched tag.
fn parse(svg: &str) -> Parsed {
    let mut reader = Reader::from_str(svg);
    let mut open: Vec<String> = Vec::new();
    let mut text = String::new();
    let mut title: Option<String> = None;
    let mut parsed = Parsed {
        boxes: Vec::new(),
        texts: Vec::new(),
    };
    let mut saw_svg = false;
    loop {
        let event = reader
            .read_event()
            .unwrap_or_else(|e| panic!("not XML at {}: {e}", reader.buffer_position()));
        match event {
            Event::Start(e) => {
                let name = String::from_utf8(e.name().as_ref().to_vec()).unwrap();
                saw_svg |= name == "svg";
                open.push(name);
                text.clear();
            }
            Event::End(e) => {
                let name = open.pop().expect("end tag without start");
                assert_eq!(e.name().as_ref(), name.as_bytes());
                match name.as_str() {
                    "title" => title = Some(std::mem::take(&mut text)),
                    "text" => parsed.texts.push(std::mem::take(&mut text)),
                    _ => {}
                }
            }
            Event::Empty(e) if e.name().as_ref() == b"rect" => {
                if let Some(title) = title.take() {
                    let fill = e.try_get_attribute("fill").unwrap().expect("rect fill");
                    let fill = String::from_utf8(fill.value.to_vec()).unwrap();
                    parsed.boxes.push((title, fill));
                }
            }
            Event::Text(t) => text.push_str(&t.decode().unwrap()),
            Event::GeneralRef(r) => text.push_str(match r.as_ref() {
                b"lt" => "<",
                b"gt" => ">",
                b"amp" => "&",
                b"quot" => "\"",
                b"apos" => "'",
                other => panic!("unexpected entity {other:?}"),
            }),
            Event::Eof => break,
            _ => {}
        }
    }
    assert!(saw_svg, "no <svg> element");
    assert!(open.is_empty(), "unclosed elements: {open:?}");
    parsed
}

fn render(profile: &Profile, opts: &WriteOptions) -> String {
    let mut out = Vec::new();
    write(profile, Format::Svg, opts, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn rgb(fill: &str) -> [u8; 3] {
    let inner = fill
        .strip_prefix("rgb(")
        .and_then(|s| s.strip_suffix(')'))
        .unwrap_or_else(|| panic!("fill {fill}"));
    let parts: Vec<u8> = inner
        .split(',')
        .map(|p| p.trim().parse().unwrap())
        .collect();
    [parts[0], parts[1], parts[2]]
}

fn fills_of<'a>(parsed: &'a Parsed, name: &str) -> Vec<&'a str> {
    let prefix = format!("{name} (");
    parsed
        .boxes
        .iter()
        .filter(|(title, _)| title.starts_with(&prefix))
        .map(|(_, fill)| fill.as_str())
        .collect()
}

#[test]
fn flamegraph_of_the_fixture() {
    let profile = fixture::profile();
    let svg = render(&profile, &WriteOptions::default());
    assert!(svg.starts_with("<?xml"));
    assert!(svg.trim_end().ends_with("</svg>"));
    let parsed = parse(&svg);

    // Title, count name, and the subtitle from the metadata.
    assert!(
        parsed.texts.iter().any(|t| t == "stackscope"),
        "{:?}",
        parsed.texts
    );
    assert!(parsed
        .texts
        .iter()
        .any(|t| t == "cpu-clock at 99 Hz, 2.5 s"));
    let total = profile.total_samples();
    assert!(
        parsed
            .boxes
            .iter()
            .any(|(t, _)| *t == format!("all ({total} samples, 100%)")),
        "{:?}",
        parsed.boxes
    );

    // Every comm is a root, and every frame name is shown (kernel and inline annotations are
    // for the palette; inferno strips them from the names it shows).
    for name in [
        "worker",
        "worker-io",
        "swapper/0",
        "main",
        "compute",
        "square",
        "ksys_read",
        "[unknown]",
        "[truncated]",
        "[Missed User Stack]",
        "<[u8: 8] as core::fmt::Debug>::fmt\u{fffd}extra",
    ] {
        assert!(!fills_of(&parsed, name).is_empty(), "no box for {name}");
    }
    assert!(parsed
        .boxes
        .iter()
        .all(|(t, _)| !t.contains("_[k]") && !t.contains("_[i]")));

    // Kernel frames are orange (no blue), user code is red (some blue), inlined frames aqua.
    for kernel in ["ksys_read", "entry_SYSCALL_64", "default_idle"] {
        for fill in fills_of(&parsed, kernel) {
            let [r, g, b] = rgb(fill);
            assert!(b == 0 && r > g, "{kernel}: {fill}");
        }
    }
    for user in ["main", "compute", "read"] {
        for fill in fills_of(&parsed, user) {
            let [r, g, b] = rgb(fill);
            assert!(b > 0 && r > g, "{user}: {fill}");
        }
    }
    for fill in fills_of(&parsed, "square") {
        let [r, g, b] = rgb(fill);
        assert!(g == b && g > r, "square: {fill}");
    }
}

#[test]
fn a_profile_of_time_counts_microseconds() {
    let svg = render(&fixture::wall(), &WriteOptions::default());
    assert!(svg.contains("nap (800,000 µs, 80.00%)"), "{svg}");
    assert!(svg.contains("time in µs"), "the subtitle names the unit");
}

#[test]
fn a_profile_of_memory_counts_bytes() {
    let svg = render(&fixture::memory(false), &WriteOptions::default());
    assert!(svg.contains("load (100,000 bytes, 97.09%)"), "{svg}");
    assert!(
        svg.contains(">bytes allocated, 1.0 s<"),
        "the subtitle names the unit: {svg}"
    );
    let held = render(&fixture::memory(true), &WriteOptions::default());
    assert!(held.contains("bytes still held at the end"), "{held}");
}

#[test]
fn custom_title_is_escaped() {
    let opts = WriteOptions {
        title: Some("CPU <worker> & co".to_string()),
        ..WriteOptions::default()
    };
    let parsed = parse(&render(&fixture::profile(), &opts));
    assert!(
        parsed.texts.iter().any(|t| t == "CPU <worker> & co"),
        "{:?}",
        parsed.texts
    );
}

#[test]
fn delimiter_shows_as_a_frame_when_asked() {
    let opts = WriteOptions {
        delimiter: true,
        ..WriteOptions::default()
    };
    let parsed = parse(&render(&fixture::profile(), &opts));
    assert!(!fills_of(&parsed, "-").is_empty());
    let parsed = parse(&render(&fixture::profile(), &WriteOptions::default()));
    assert!(fills_of(&parsed, "-").is_empty());
}

#[test]
fn empty_profile_is_a_valid_svg_that_says_so() {
    let opts = WriteOptions {
        title: Some("idle <box>".to_string()),
        ..WriteOptions::default()
    };
    let svg = render(&Profile::default(), &opts);
    let parsed = parse(&svg);
    assert!(
        parsed.texts.iter().any(|t| t == "idle <box>"),
        "{:?}",
        parsed.texts
    );
    assert!(
        parsed.texts.iter().any(|t| t.contains("No samples")),
        "{svg}"
    );
}

#[test]
fn zero_counts_are_an_empty_profile() {
    let mut profile = fixture::profile();
    for sample in &mut profile.samples {
        sample.count = 0;
    }
    let parsed = parse(&render(&profile, &WriteOptions::default()));
    assert!(parsed.texts.iter().any(|t| t.contains("No samples")));
}

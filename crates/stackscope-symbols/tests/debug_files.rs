//! Names for binaries as distributions ship them, built here with gcc and stripped with
//! binutils: symbols only in MiniDebugInfo, debug info only through a debug link (in each of
//! the places it is looked for, and refused with the wrong CRC), a fetcher asked last and only
//! when needed, and where the functions of a stripped library start.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use common::{frames_at, line_of, symbol_address, symbol_offset};
use stackscope_symbols::{DebugFiles, FetchDebugFile, SymFrame, Symbolizer};
use stackscope_testkit::compile;
use stackscope_testkit::shipped::{add_debug_link, add_mini_debuginfo, keep_debug, strip};
use tempfile::TempDir;

const TWO_HOT: &str = include_str!("../../stackscope/tests/workloads/two_hot.c");
const BUILD_ID: &str = "5eed0000112233445566778899aabbccddeeff00";

/// The two-function program, built with debug info and a known build-id.
fn build(dir: &Path, extra: &[&str], out: &str) -> PathBuf {
    let build_id = format!("-Wl,--build-id=0x{BUILD_ID}");
    let args = [&["-O2", "-g", build_id.as_str()], extra].concat();
    compile("gcc", dir, ("two_hot.c", TWO_HOT), &args, &[], out)
}

/// A symbolizer that finds no separate debug file but where it is told to.
fn symbolizer_in(dirs: &[&Path]) -> Symbolizer {
    Symbolizer::with_debug_dirs(dirs.iter().map(|d| d.to_path_buf()).collect())
}

fn hot_offsets(unstripped: &Path) -> [u64; 2] {
    let alpha = symbol_offset(unstripped, |n| n == "hot_alpha").0;
    let beta = symbol_offset(unstripped, |n| n == "hot_beta").0;
    [alpha, beta]
}

fn names(frames: &[Vec<SymFrame>]) -> Vec<Option<&str>> {
    frames
        .iter()
        .map(|f| f.first().map(|f| f.name.as_str()))
        .collect()
}

/// Asserts both functions are named, with the source lines of their loops' bodies when
/// `lines` (the lines an address at their start gives are their first lines or the loop's:
/// somewhere between the function's opening and its marked line).
fn assert_named(frames: &[Vec<SymFrame>], lines: bool) {
    assert_eq!(names(frames), [Some("hot_alpha"), Some("hot_beta")]);
    for (f, marker) in frames.iter().zip(["ALPHA_LINE", "BETA_LINE"]) {
        let f = &f[0];
        if lines {
            let line = f.line.expect("a source line");
            let marked = line_of(TWO_HOT, marker);
            assert!(
                (marked - 4..=marked).contains(&line),
                "{f:?}: not near {marked}"
            );
            assert!(f.file.as_deref().is_some_and(|p| p.ends_with("two_hot.c")));
        } else {
            assert_eq!((f.file.as_deref(), f.line), (None, None), "{f:?}");
        }
    }
}

#[test]
fn symbols_only_in_mini_debuginfo_name_static_functions() {
    let dir = TempDir::new().unwrap();
    let prog = build(dir.path(), &[], "prog");
    let stripped = dir.path().join("prog-stripped");
    strip("--strip-all", &prog, &stripped);
    let offsets = hot_offsets(&prog);
    let empty = dir.path().join("empty");

    let plain = symbolizer_in(&[&empty]).symbolize_file(&stripped, None, &offsets);
    assert_eq!(names(&plain.unwrap()), [None, None], "stripped, no source");

    add_mini_debuginfo(&prog, &stripped);
    let named = symbolizer_in(&[&empty]).symbolize_file(&stripped, None, &offsets);
    assert_named(&named.unwrap(), false);
}

#[test]
fn debug_link_is_followed_to_each_place_gdb_looks_with_its_crc_checked() {
    let dir = TempDir::new().unwrap();
    let prog = build(dir.path(), &["-Wl,--build-id=none"], "prog");
    let offsets = hot_offsets(&prog);
    let debug = dir.path().join("prog.debug");
    keep_debug(&prog, &debug);
    let bin_dir = dir.path().join("bin");
    let stripped = bin_dir.join("prog");
    std::fs::create_dir_all(&bin_dir).unwrap();
    strip("--strip-all", &prog, &stripped);
    add_debug_link(&stripped, &debug);
    std::fs::remove_file(&debug).unwrap();

    let debug_dir = dir.path().join("debug");
    let inside = bin_dir.strip_prefix("/").unwrap();
    let places = [
        bin_dir.join("prog.debug"),
        bin_dir.join(".debug/prog.debug"),
        debug_dir.join(inside).join("prog.debug"),
    ];
    for place in &places {
        std::fs::create_dir_all(place.parent().unwrap()).unwrap();
        keep_debug(&prog, place);
        let named = symbolizer_in(&[&debug_dir]).symbolize_file(&stripped, None, &offsets);
        assert_named(&named.unwrap(), true);

        // Another build's debug info under the same name: its CRC differs, so it is not used.
        let mut other = std::fs::read(place).unwrap();
        other.extend_from_slice(b"another build");
        std::fs::write(place, other).unwrap();
        let refused = symbolizer_in(&[&debug_dir]).symbolize_file(&stripped, None, &offsets);
        assert_eq!(
            names(&refused.unwrap()),
            [None, None],
            "{}",
            place.display()
        );
        std::fs::remove_file(place).unwrap();
    }
}

#[test]
fn debug_file_only_under_a_build_id_directory() {
    let dir = TempDir::new().unwrap();
    let prog = build(dir.path(), &[], "prog");
    let stripped = dir.path().join("prog-stripped");
    strip("--strip-all", &prog, &stripped);
    let debug_dir = dir.path().join("debug");
    let place = stackscope_testkit::shipped::build_id_path(&debug_dir, BUILD_ID);
    std::fs::create_dir_all(place.parent().unwrap()).unwrap();
    keep_debug(&prog, &place);
    // Also MiniDebugInfo: the debug file comes first, for its lines.
    add_mini_debuginfo(&prog, &stripped);
    let named = symbolizer_in(&[&debug_dir]).symbolize_file(&stripped, None, &hot_offsets(&prog));
    assert_named(&named.unwrap(), true);
}

/// Hands out one file for one build-id, and remembers what it was asked.
struct Fetcher {
    build_id: Vec<u8>,
    file: Option<PathBuf>,
    asked: Mutex<Vec<Vec<u8>>>,
}

impl FetchDebugFile for Fetcher {
    fn fetch(&self, build_id: &[u8]) -> Option<PathBuf> {
        self.asked.lock().unwrap().push(build_id.to_vec());
        (build_id == self.build_id)
            .then(|| self.file.clone())
            .flatten()
    }
}

fn fetcher(file: Option<PathBuf>) -> Arc<Fetcher> {
    let build_id = (0..BUILD_ID.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&BUILD_ID[i..i + 2], 16).unwrap())
        .collect();
    Arc::new(Fetcher {
        build_id,
        file,
        asked: Mutex::new(Vec::new()),
    })
}

#[test]
fn the_fetcher_is_asked_last_once_and_only_for_what_is_left_unnamed() {
    let dir = TempDir::new().unwrap();
    let prog = build(dir.path(), &[], "prog");
    let stripped = dir.path().join("prog-stripped");
    strip("--strip-all", &prog, &stripped);
    let fetched = dir.path().join("fetched.debug");
    keep_debug(&prog, &fetched);
    let offsets = hot_offsets(&prog);
    let empty = dir.path().join("empty");
    let files = |fetcher: &Arc<Fetcher>| {
        DebugFiles::new(vec![empty.clone()])
            .with_fetcher(fetcher.clone() as Arc<dyn FetchDebugFile>)
    };

    // The binary names its own functions: nothing to fetch.
    let idle = fetcher(Some(fetched.clone()));
    let mut symbolizer = Symbolizer::with_debug_files(files(&idle));
    assert_named(
        &symbolizer.symbolize_file(&prog, None, &offsets).unwrap(),
        true,
    );
    assert!(idle.asked.lock().unwrap().is_empty());

    // Stripped: fetched by its build-id, once however often it is named.
    let busy = fetcher(Some(fetched.clone()));
    let mut symbolizer = Symbolizer::with_debug_files(files(&busy));
    for _ in 0..2 {
        assert_named(
            &symbolizer
                .symbolize_file(&stripped, None, &offsets)
                .unwrap(),
            true,
        );
    }
    assert_eq!(
        *busy.asked.lock().unwrap(),
        std::slice::from_ref(&busy.build_id)
    );

    // Nothing to be had: the functions stay unnamed, and the file is still read.
    let none = fetcher(None);
    let mut symbolizer = Symbolizer::with_debug_files(files(&none));
    let unnamed = symbolizer
        .symbolize_file(&stripped, None, &offsets)
        .unwrap();
    assert_eq!(names(&unnamed), [None, None]);
    assert_eq!(none.asked.lock().unwrap().len(), 1);

    // MiniDebugInfo names them: nothing left to fetch for.
    add_mini_debuginfo(&prog, &stripped);
    let idle = fetcher(Some(fetched));
    let mut symbolizer = Symbolizer::with_debug_files(files(&idle));
    assert_named(
        &symbolizer
            .symbolize_file(&stripped, None, &offsets)
            .unwrap(),
        false,
    );
    assert!(idle.asked.lock().unwrap().is_empty());
}

#[test]
fn a_stripped_librarys_functions_start_where_their_unwind_entries_do() {
    let dir = TempDir::new().unwrap();
    let lib = build(
        dir.path(),
        &["-shared", "-fPIC", "-DLIBRARY"],
        "libtwo_hot.so",
    );
    let stripped = dir.path().join("libtwo_hot-stripped.so");
    strip("--strip-all", &lib, &stripped);
    let empty = dir.path().join("empty");
    let mut symbolizer = symbolizer_in(&[&empty]);
    let [alpha, beta] = hot_offsets(&lib);
    let (_, alpha_size) = symbol_offset(&lib, |n| n == "hot_alpha");
    let inside = [alpha, alpha + 1, alpha + alpha_size - 1, beta, beta + 5];
    let frames = symbolizer.symbolize_file(&stripped, None, &inside).unwrap();
    assert!(frames.iter().all(Vec::is_empty), "static functions named");

    let data = std::fs::read(&lib).unwrap();
    let elf = object::File::parse(&*data).unwrap();
    let (alpha_at, _) = symbol_address(&elf, |n| n == "hot_alpha");
    let (beta_at, _) = symbol_address(&elf, |n| n == "hot_beta");
    assert_ne!(alpha_at, beta_at);
    let starts = symbolizer.function_starts(&stripped, &inside);
    assert_eq!(starts, [alpha_at, alpha_at, alpha_at, beta_at, beta_at]);
    // The ELF header is no function: its own address.
    assert_eq!(symbolizer.function_starts(&stripped, &[0x10]), [0x10]);
    // A file that cannot be read: the offsets themselves.
    let missing = dir.path().join("missing.so");
    assert_eq!(symbolizer.function_starts(&missing, &[alpha]), [alpha]);
    let frames = frames_at(&mut symbolizer, &lib, None, alpha + 1);
    assert_eq!(frames[0].name, "hot_alpha", "unstripped: named");
}

#[test]
fn a_kept_binary_is_named_again_from_what_was_parsed_and_a_replaced_one_anew() {
    let dir = TempDir::new().unwrap();
    let prog = build(dir.path(), &[], "prog");
    let offsets = hot_offsets(&prog);
    let empty = dir.path().join("empty");
    let watched = dir.path().join("watched");
    std::fs::copy(&prog, &watched).unwrap();

    let mut kept = symbolizer_in(&[&empty]).keeping(1);
    for _ in 0..2 {
        assert_named(
            &kept.symbolize_file(&watched, None, &offsets).unwrap(),
            true,
        );
        assert_eq!(kept.binaries_kept(), 1);
    }

    // Replaced at its path by a stripped build whose symbols are only in its MiniDebugInfo:
    // the DWARF parsed before must not name it.
    let stripped = dir.path().join("stripped");
    strip("--strip-all", &prog, &stripped);
    add_mini_debuginfo(&prog, &stripped);
    std::fs::rename(&stripped, &watched).unwrap();
    for _ in 0..2 {
        assert_named(
            &kept.symbolize_file(&watched, None, &offsets).unwrap(),
            false,
        );
    }

    // A second binary: the bound lets the first go.
    assert_named(&kept.symbolize_file(&prog, None, &offsets).unwrap(), true);
    assert_eq!(kept.binaries_kept(), 1);

    let mut released = symbolizer_in(&[&empty]);
    assert_named(
        &released.symbolize_file(&prog, None, &offsets).unwrap(),
        true,
    );
    assert_eq!(
        released.binaries_kept(),
        0,
        "a recording's symbolizer keeps nothing"
    );
}

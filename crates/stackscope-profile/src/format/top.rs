//! The hottest functions as a table for a terminal, as `perf report`'s first screen shows
//! them: per function (its name and module), its self share (samples taken in the function
//! itself, the stack's leaf), its total share (samples with the function anywhere on the
//! stack, counted once however often it recurses) and its self samples, hottest by self
//! share first.
//!
//! ```text
//! # 1500 samples in 3.0 s; the 2 of 9 functions with the most self samples
//!  Self%  Total%  Samples  Module       Function
//!  69.8%   70.0%     1047  split_nofp   func_b
//!  29.9%   30.0%      449  split_nofp   func_a
//! ```
//!
//! A function is its shown name and module: frames that differ only in their source line
//! count as one function.

use super::check_written;
use crate::{printable, Profile, StackId};
use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::io::{self, Write};

/// How many functions the table shows when not told: a screen's worth.
pub const DEFAULT_ROWS: usize = 20;

/// A module column wider than this is cut on the left, where a path is least telling.
const MODULE_WIDTH: usize = 24;

/// Options of the table.
#[derive(Debug, Clone)]
pub struct TopOptions {
    /// How many functions to show, hottest first.
    pub rows: usize,
}

impl Default for TopOptions {
    fn default() -> Self {
        TopOptions { rows: DEFAULT_ROWS }
    }
}

/// One function's counts.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Samples taken in the function itself (the stack's leaf).
    pub own: u64,
    /// Samples with the function anywhere on the stack, once however often it recurses.
    pub total: u64,
}

/// Adds `count` samples of one stack, given as its functions root first, to `functions`:
/// the one rule for self and total counts, whatever names a function (`report --top` its
/// name and module, a live view a number it gave them). `on_stack` is scratch space.
pub fn count_stack<K: Hash + Eq + Clone>(
    functions: &mut HashMap<K, Counts>,
    stack: impl ExactSizeIterator<Item = K>,
    count: u64,
    on_stack: &mut HashSet<K>,
) {
    on_stack.clear();
    let leaf = stack.len();
    for (i, key) in stack.enumerate() {
        let counts = functions.entry(key.clone()).or_default();
        if i + 1 == leaf {
            counts.own += count;
        }
        if on_stack.insert(key) {
            counts.total += count;
        }
    }
}

/// One row of the table: a function's name, module and counts.
pub struct Row<'a> {
    pub name: &'a str,
    pub module: &'a str,
    pub counts: Counts,
}

/// Writes the table of the `opts.rows` hottest functions. Fails with
/// [`io::ErrorKind::InvalidData`] on an invalid profile, as every writer does.
pub fn write(profile: &Profile, opts: &TopOptions, out: &mut dyn Write) -> io::Result<()> {
    check_written(profile)?;
    // Each stack once, with the samples of every thread and CPU that took it.
    let mut by_stack: HashMap<StackId, u64> = HashMap::new();
    for sample in &profile.samples {
        *by_stack.entry(sample.stack).or_default() += sample.count;
    }
    let mut functions: HashMap<(String, String), Counts> = HashMap::new();
    let mut on_stack = HashSet::new();
    for (&stack, &count) in &by_stack {
        let frames = profile.stack(stack).frames.iter().map(|&id| {
            let frame = profile.frame(id);
            let module = frame.module.as_deref().map(printable).unwrap_or_default();
            (frame.shown_name().into_owned(), module.into_owned())
        });
        count_stack(&mut functions, frames, count, &mut on_stack);
    }
    let mut rows: Vec<((String, String), Counts)> = functions.into_iter().collect();
    rows.sort_by(|(a_key, a), (b_key, b)| {
        (b.own, b.total)
            .cmp(&(a.own, a.total))
            .then_with(|| a_key.cmp(b_key))
    });
    let total: u64 = by_stack.values().sum();
    let unit = profile.meta.count_unit.short_name();
    let shown = rows.len().min(opts.rows);
    writeln!(
        out,
        "# {total} {unit} in {:.1} s; the {shown} of {} functions with the most self {unit}",
        profile.meta.duration_secs,
        rows.len()
    )?;
    let rows: Vec<Row> = rows[..shown]
        .iter()
        .map(|((name, module), counts)| Row {
            name,
            module,
            counts: *counts,
        })
        .collect();
    let header = if profile.meta.count_unit.is_samples() {
        "Samples"
    } else {
        unit
    };
    write_rows(&rows, total, header, out)
}

/// Writes `rows` under the table's column heads, shares out of `total`; `header` heads the
/// count column.
pub fn write_rows(rows: &[Row], total: u64, header: &str, out: &mut dyn Write) -> io::Result<()> {
    let module_width = rows
        .iter()
        .map(|row| module_shown(row.module).chars().count())
        .max()
        .unwrap_or(0)
        .max("Module".len());
    let samples_width = rows
        .iter()
        .map(|row| row.counts.own.to_string().len())
        .max()
        .unwrap_or(0)
        .max(header.chars().count());
    writeln!(
        out,
        " Self%  Total%  {header:>samples_width$}  {:<module_width$}  Function",
        "Module"
    )?;
    for row in rows {
        writeln!(
            out,
            "{:5.1}%  {:5.1}%  {:>samples_width$}  {:<module_width$}  {}",
            share(row.counts.own, total),
            share(row.counts.total, total),
            row.counts.own,
            module_shown(row.module),
            row.name
        )?;
    }
    Ok(())
}

/// `n` as a percentage of `total` (0 of none).
pub fn share(n: u64, total: u64) -> f64 {
    match total {
        0 => 0.0,
        total => 100.0 * n as f64 / total as f64,
    }
}

/// A module as the table shows it: its file name for a path (the directory rarely tells
/// functions apart), cut to [`MODULE_WIDTH`] from the left; `-` for none (markers).
pub fn module_shown(module: &str) -> String {
    let name = module.rsplit('/').next().unwrap_or(module);
    if name.is_empty() {
        return "-".to_string();
    }
    let chars = name.chars().count();
    if chars <= MODULE_WIDTH {
        return name.to_string();
    }
    let kept: String = name.chars().skip(chars - (MODULE_WIDTH - 1)).collect();
    format!("…{kept}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Frame, FrameKind, Metadata, ProfileBuilder, Thread};

    /// `main` calling `hot` (3 samples) and `cold` (1), `hot` also recursing into itself (2).
    fn profile() -> Profile {
        let mut b = ProfileBuilder::new(Metadata::default());
        let thread = b.thread(Thread {
            pid: 1,
            tid: 1,
            comm: "prog".to_string(),
            process_name: "prog".to_string(),
        });
        let frame = |b: &mut ProfileBuilder, name: &str, line: u32| {
            b.frame(Frame {
                name: name.to_string(),
                module: Some("/usr/bin/prog".to_string()),
                line: Some(line),
                kind: FrameKind::User,
                ..Frame::default()
            })
        };
        let main = frame(&mut b, "main", 1);
        let hot = frame(&mut b, "hot", 10);
        let hot_again = frame(&mut b, "hot", 11);
        let cold = frame(&mut b, "cold", 20);
        for (frames, count) in [
            (vec![main, hot], 3),
            (vec![main, cold], 1),
            (vec![main, hot, hot_again], 2),
        ] {
            let stack = b.stack(&frames);
            b.add(thread, stack, None, count);
        }
        b.finish()
    }

    fn table(profile: &Profile, rows: usize) -> Vec<String> {
        let mut out = Vec::new();
        write(profile, &TopOptions { rows }, &mut out).unwrap();
        String::from_utf8(out)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn functions_are_ranked_by_self_share_with_recursion_counted_once_in_total() {
        let lines = table(&profile(), 20);
        assert_eq!(
            lines[0],
            "# 6 samples in 0.0 s; the 3 of 3 functions with the most self samples"
        );
        assert_eq!(lines[1], " Self%  Total%  Samples  Module  Function");
        assert_eq!(lines[2], " 83.3%   83.3%        5  prog    hot");
        assert_eq!(lines[3], " 16.7%   16.7%        1  prog    cold");
        assert_eq!(lines[4], "  0.0%  100.0%        0  prog    main");
        assert_eq!(lines.len(), 5);
    }

    #[test]
    fn only_the_rows_asked_for_are_shown() {
        let lines = table(&profile(), 1);
        assert_eq!(lines.len(), 3);
        assert!(lines[0].contains("the 1 of 3 functions"), "{}", lines[0]);
        assert!(lines[2].ends_with("hot"), "{}", lines[2]);
    }

    #[test]
    fn a_long_module_is_cut_on_the_left_and_none_is_a_dash() {
        assert_eq!(module_shown("/lib/x86_64-linux-gnu/libc.so.6"), "libc.so.6");
        assert_eq!(module_shown(""), "-");
        let long = module_shown("libsomething-with-a-very-long-name.so.1");
        assert_eq!(long.chars().count(), MODULE_WIDTH);
        assert!(long.starts_with('…') && long.ends_with(".so.1"), "{long}");
    }
}

//! `top` without a terminal, or with `--batch N`: a plain-text snapshot each refresh, as
//! `top -b` prints them: a header line with the figures, then `report --top`'s table.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::Result;
use stackscope_profile::format::top::{self, DEFAULT_ROWS};

use super::view::View;
use super::{due, stop, Session};

/// Prints a snapshot a refresh until `count` were printed (then stops sampling) or sampling
/// ends (then prints what came in since the last one).
pub(super) fn run(
    mut session: Session,
    mut view: View,
    count: Option<u64>,
    rows: Option<usize>,
) -> Result<(Session, Option<String>)> {
    let rows = rows.unwrap_or(DEFAULT_ROWS);
    let refresh = session.refresh;
    let mut printed = 0;
    let mut pending = false;
    let mut tick = Instant::now();
    loop {
        let wait = refresh.saturating_sub(tick.elapsed());
        match session.next(wait.max(Duration::from_millis(10))) {
            Ok(update) => {
                view.update(update);
                pending = true;
            }
            Err(true) => {
                if pending {
                    print(&mut session, &mut view, rows)?;
                }
                return Ok((session, None));
            }
            Err(false) => {}
        }
        // A refresh is due with the hand-over that came in, or without one when none came.
        let since = tick.elapsed();
        if due(pending, since, refresh) {
            print(&mut session, &mut view, rows)?;
            view.rotate();
            (pending, tick) = (false, Instant::now());
            printed += 1;
            if count.is_some_and(|n| printed >= n) {
                stop(&session);
                return Ok((session, None));
            }
        }
    }
}

fn print(session: &mut Session, view: &mut View, rows: usize) -> Result<()> {
    session.figures.measure();
    let table = view.table();
    let header = session
        .figures
        .header(&table, view.complete, view.past_kept);
    let shown: Vec<top::Row> = table
        .rows
        .iter()
        .take(rows)
        .map(|row| top::Row {
            name: &row.name,
            module: &row.module,
            counts: row.counts,
        })
        .collect();
    let mut out = std::io::stdout().lock();
    let at = session.started.elapsed().as_secs_f64();
    writeln!(out, "# stackscope top at {at:.1} s: {header}")?;
    top::write_rows(&shown, table.total, "Samples", &mut out)?;
    writeln!(out)?;
    out.flush()?;
    Ok(())
}

//! `top` on a terminal: the full-screen view (ratatui over crossterm) and its keys. The
//! terminal is given back as it was on every way out: a key, the target's exit, a stop
//! signal, an error or a panic (ratatui's hook restores it before the panic is reported).

use std::io::{stdout, BufWriter, Stdout};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::crossterm::execute;
use ratatui::crossterm::terminal::{enable_raw_mode, EnterAlternateScreen};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::Paragraph;
use ratatui::{Frame, Terminal};

use super::view::{Grouping, Key, Row, SortBy, Table, View};
use super::{due, stop, Session};
use stackscope_profile::format::top::{module_shown, share};

/// Callers and callees an expanded row shows, each.
const NEIGHBOURS: usize = 5;
/// How long the view waits for a key before looking for new samples.
const KEY_WAIT: Duration = Duration::from_millis(50);
/// The levels of a sparkline, lowest first.
const LEVELS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// Room for a whole frame of a big terminal, so that each frame reaches it in one write: a
/// frame cut into many writes shows half-drawn to whatever reads the terminal between them.
const FRAME_BYTES: usize = 1 << 18;

/// The terminal the view draws on: each frame buffered whole and written at its end.
type Term = Terminal<CrosstermBackend<BufWriter<Stdout>>>;

/// Set once a thread panicked: the terminal was given back for its message, so the view ends.
static PANICKED: AtomicBool = AtomicBool::new(false);

/// Gives the terminal back when dropped, however the view ends.
struct Restore;

/// Raw mode, the alternate screen, and a panic hook that gives the terminal back before any
/// thread's panic is reported (the message would be lost on the alternate screen) and ends
/// the view: with the terminal in line mode again, keys would no longer come one by one.
fn take_terminal() -> Result<Term> {
    let reported = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !PANICKED.swap(true, Ordering::SeqCst) {
            ratatui::restore();
        }
        reported(info);
    }));
    enable_raw_mode()?;
    execute!(stdout(), EnterAlternateScreen)?;
    let backend = CrosstermBackend::new(BufWriter::with_capacity(FRAME_BYTES, stdout()));
    Ok(Terminal::new(backend)?)
}

impl Drop for Restore {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

/// What the keys changed that the view itself does not hold.
struct Screen {
    selected: usize,
    expanded: Option<Key>,
    paused: bool,
    /// The filter being typed, after `/`.
    typing: Option<String>,
    status: String,
    table: Table,
    header: String,
}

/// Runs the view until `q`, Ctrl-C, a stop signal or the end of sampling.
pub(super) fn run(mut session: Session, mut view: View) -> Result<(Session, Option<String>)> {
    let _restore = Restore;
    let mut terminal = take_terminal()?;
    let mut screen = Screen {
        selected: 0,
        expanded: None,
        paused: false,
        typing: None,
        status: "waiting for the first samples".into(),
        table: view.table(),
        header: String::new(),
    };
    let mut tick = Instant::now();
    let mut pending = false;
    let mut dirty = true;
    loop {
        if PANICKED.load(Ordering::SeqCst) {
            stop(&session);
            return Ok((session, Some("a thread of stackscope panicked".into())));
        }
        if dirty {
            draw(&mut terminal, &session, &mut view, &screen)?;
            dirty = false;
        }
        // The terminal's event reader spins on a hung-up terminal (it reads end of file
        // forever), so a hang-up is seen here first and ends the view, as SIGHUP stops sampling.
        if !keys_may_come(KEY_WAIT) {
            stop(&session);
            away_from_the_dead_terminal();
            return Ok((session, Some("the terminal hung up".into())));
        }
        if event::poll(Duration::ZERO)? {
            match event::read()? {
                Event::Key(key) if key.kind != KeyEventKind::Release => {
                    if !on_key(key, &session, &mut view, &mut screen) {
                        stop(&session);
                        return Ok((session, None));
                    }
                    refresh_table(&mut session, &mut view, &mut screen, false);
                    // A key redraws the whole screen: whatever else wrote to the terminal
                    // (a message of another program) is gone after it.
                    terminal.clear()?;
                    dirty = true;
                }
                Event::Resize(..) => dirty = true,
                _ => {}
            }
        }
        loop {
            match session.next(Duration::ZERO) {
                Ok(update) => {
                    view.update(update);
                    pending = true;
                }
                Err(true) => {
                    let why = ended(&session);
                    return Ok((session, Some(why)));
                }
                Err(false) => break,
            }
        }
        let since = tick.elapsed();
        if due(pending, since, session.refresh) {
            refresh_table(&mut session, &mut view, &mut screen, true);
            view.rotate();
            (pending, tick, dirty) = (false, Instant::now(), true);
        }
    }
}

/// Waits up to `wait` for input on standard input when it is the terminal, and says whether
/// the terminal is still there (false once it hung up or was closed).
fn keys_may_come(wait: Duration) -> bool {
    // SAFETY: isatty and poll only read the descriptor's state and the one pollfd given.
    if unsafe { libc::isatty(0) } != 1 {
        std::thread::sleep(wait);
        return true;
    }
    let mut fd = libc::pollfd {
        fd: 0,
        events: libc::POLLIN,
        revents: 0,
    };
    let ready = unsafe { libc::poll(&mut fd, 1, wait.as_millis() as libc::c_int) };
    ready <= 0 || fd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) == 0
}

/// Points standard output and error at /dev/null once the terminal hung up: every write to
/// it fails, and a failed message must not keep the profile so far from being written.
fn away_from_the_dead_terminal() {
    // SAFETY: plain descriptor calls on a file opened here; 1 and 2 stay open, now on /dev/null.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if null >= 0 {
            libc::dup2(null, 1);
            libc::dup2(null, 2);
            libc::close(null);
        }
    }
}

/// Why the view ended without a key.
fn ended(session: &Session) -> String {
    match session.stop.load(std::sync::atomic::Ordering::SeqCst) {
        true => "stopped".into(),
        false => "sampling ended (the target exited, or the duration ran out)".into(),
    }
}

/// Counts the rows anew (unless paused, when only a key asks) and the header's figures.
fn refresh_table(session: &mut Session, view: &mut View, screen: &mut Screen, tick: bool) {
    if tick {
        session.figures.measure();
    }
    if screen.paused && tick {
        return;
    }
    screen.table = view.table();
    screen.header = session
        .figures
        .header(&screen.table, view.complete, view.past_kept);
    if tick && screen.status.starts_with("waiting") {
        screen.status.clear();
    }
    screen.selected = screen
        .selected
        .min(screen.table.rows.len().saturating_sub(1));
}

/// Acts on a key; false to quit.
fn on_key(key: KeyEvent, session: &Session, view: &mut View, screen: &mut Screen) -> bool {
    let ctrl_c = key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL);
    if ctrl_c {
        return false;
    }
    if let Some(typed) = &mut screen.typing {
        match key.code {
            KeyCode::Enter => {
                view.settings.filter = std::mem::take(typed);
                screen.typing = None;
                screen.selected = 0;
            }
            KeyCode::Esc => screen.typing = None,
            KeyCode::Backspace => {
                typed.pop();
            }
            KeyCode::Char(c) => typed.push(c),
            _ => {}
        }
        return true;
    }
    let settings = &mut view.settings;
    match key.code {
        KeyCode::Char('q') => return false,
        KeyCode::Char('s') => {
            settings.sort = match settings.sort {
                SortBy::Own => SortBy::Total,
                SortBy::Total => SortBy::Own,
            }
        }
        KeyCode::Char('/') => screen.typing = Some(String::new()),
        KeyCode::Char('k') => settings.kernel = !settings.kernel,
        KeyCode::Char('g') => {
            settings.grouping = settings.grouping.next();
            screen.expanded = None;
        }
        KeyCode::Char('c') => settings.cumulative = !settings.cumulative,
        KeyCode::Char('p') | KeyCode::Char(' ') => screen.paused = !screen.paused,
        KeyCode::Char('w') => screen.status = session.write_so_far(),
        KeyCode::Enter => {
            let key = screen.table.rows.get(screen.selected).map(|r| r.key);
            screen.expanded = if screen.expanded == key { None } else { key };
        }
        KeyCode::Up => screen.selected = screen.selected.saturating_sub(1),
        KeyCode::Down => screen.selected += 1,
        KeyCode::Esc => {
            settings.filter.clear();
            screen.expanded = None;
        }
        _ => {}
    }
    true
}

fn draw(terminal: &mut Term, session: &Session, view: &mut View, screen: &Screen) -> Result<()> {
    terminal.draw(|frame| render(frame, session, view, screen))?;
    Ok(())
}

fn render(frame: &mut Frame, session: &Session, view: &View, screen: &Screen) {
    let [top, body] =
        Layout::vertical([Constraint::Length(3), Constraint::Min(0)]).areas(frame.area());
    let settings = &view.settings;
    let mut modes = vec![
        format!(
            "sort {}",
            match settings.sort {
                SortBy::Own => "self",
                SortBy::Total => "total",
            }
        ),
        match settings.cumulative {
            true => "cumulative".to_string(),
            false => "window".to_string(),
        },
        format!("kernel {}", if settings.kernel { "on" } else { "off" }),
        format!(
            "group {}",
            match settings.grouping {
                Grouping::None => "none",
                Grouping::Process => "process",
                Grouping::Thread => "thread",
            }
        ),
    ];
    if !settings.filter.is_empty() {
        modes.push(format!("filter {:?}", settings.filter));
    }
    if screen.paused {
        modes.push("PAUSED".into());
    }
    let prompt = match &screen.typing {
        Some(typed) => format!("filter: {typed}_  (Enter applies, Esc cancels)"),
        None => format!(
            "{}  | s sort / filter Enter expand k kernel g group c cumulative p pause w write q quit  {}",
            modes.join(", "),
            screen.status
        ),
    };
    let up = session.started.elapsed().as_secs();
    let lines = vec![
        Line::from(format!("stackscope top, {up} s: {}", screen.header)),
        Line::from(prompt),
        Line::from(""),
    ];
    frame.render_widget(Paragraph::new(lines), top);
    let rows = table_lines(view, screen, body.height as usize);
    frame.render_widget(Paragraph::new(rows), body);
}

/// The column heads and as many rows as fit in `height`, the selected one highlighted and the
/// expanded one followed by its callers and callees.
fn table_lines<'a>(view: &View, screen: &Screen, height: usize) -> Vec<Line<'a>> {
    let grouped = view.settings.grouping != Grouping::None;
    let group_head = if grouped {
        format!("{:<20}  ", "Group")
    } else {
        String::new()
    };
    let mut lines = vec![Line::from(format!(
        " Self%  Total%  Samples  Trend{:15}  {group_head}{:<24}  Function",
        "", "Module"
    ))
    .style(Style::default().add_modifier(Modifier::BOLD))];
    let total = screen.table.total;
    // Keep the selected row in sight.
    let first = screen.selected.saturating_sub(height.saturating_sub(4));
    for (i, row) in screen.table.rows.iter().enumerate().skip(first) {
        if lines.len() >= height {
            break;
        }
        let mut line = Line::from(row_text(row, total, grouped));
        if i == screen.selected {
            line = line.style(Style::default().add_modifier(Modifier::REVERSED));
        }
        lines.push(line);
        if screen.expanded == Some(row.key) {
            let near = view.neighbours(row.key, NEIGHBOURS);
            for (name, n) in &near.callers {
                lines.push(Line::from(format!(
                    "        {:5.1}%  called from  {name}",
                    share(*n, total)
                )));
            }
            for (name, n) in &near.callees {
                lines.push(Line::from(format!(
                    "        {:5.1}%  calls        {name}",
                    share(*n, total)
                )));
            }
        }
    }
    lines
}

fn row_text(row: &Row, total: u64, grouped: bool) -> String {
    let group = match (&row.group, grouped) {
        (Some(group), true) => format!("{:<20.20}  ", group),
        _ => String::new(),
    };
    format!(
        "{:5.1}%  {:5.1}%  {:>7}  {:<20}  {group}{:<24}  {}",
        share(row.counts.own, total),
        share(row.counts.total, total),
        row.counts.own,
        sparkline(&row.history),
        module_shown(&row.module),
        row.name
    )
}

/// A row's self share over the last refreshes, scaled to its own highest.
fn sparkline(history: &[f64]) -> String {
    let top = history.iter().copied().fold(0.0, f64::max);
    let level = |v: f64| match top {
        t if t <= 0.0 => ' ',
        t => LEVELS[((v / t) * (LEVELS.len() - 1) as f64).round() as usize],
    };
    let line: String = history.iter().map(|&v| level(v)).collect();
    format!("{line:>20}")
}

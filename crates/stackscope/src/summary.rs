//! The end of every recording, whichever source sampled: why sampling stopped early, what the
//! source measured, how the launched command ended, the summary, and the profile written
//! where asked.

use std::process::ExitStatus;

use anyhow::Result;
use stackscope_profile::format;
use stackscope_profile::Profile;
use stackscope_stacks::{BpfFigures, LeadInFigures, ProgramCost, Recording, Rounds, SourceFigures};

use crate::output::Output;

/// What the end of a command says beyond the recording itself.
pub(crate) struct Ending<'a> {
    /// The launched command, named when it was killed by a signal.
    pub command: &'a [String],
    /// Said after "no samples were collected" when the profile is empty.
    pub why_empty: &'a str,
    /// The target is threads sampled on the CPU (a launched command, processes or threads,
    /// not the whole system), which `--off-cpu` and `--wall` could follow off it: a hint says
    /// so when it spent most of the recording there.
    pub off_cpu_hint: bool,
}

/// Reports how the recording ended, prints the summary, writes the profile with `write` and
/// returns stackscope's exit code: the launched command's, else 0 (1 when nothing was
/// sampled).
pub(crate) fn finish(
    mut recording: Recording,
    output: &Output,
    ending: Ending,
    write: impl FnOnce(&Output, &Profile) -> Result<()>,
) -> Result<i32> {
    crate::hint::word_hints(&mut recording);
    if ending.off_cpu_hint {
        let off_cpu = crate::hint::off_cpu(&recording.profile);
        recording.profile.meta.hints.extend(off_cpu);
    }
    say_failure(&recording);
    say_figures(&recording);
    let exit_code = exit_code(&recording);
    if let Some(signal) = recording.exit_status.and_then(killed_by) {
        eprintln!(
            "stackscope: {} was killed by signal {signal}",
            ending
                .command
                .first()
                .map(String::as_str)
                .unwrap_or("the command")
        );
    }
    let profile = recording.profile;
    eprint!("{}", format::summary(&profile));
    if profile.samples.is_empty() {
        eprintln!(
            "stackscope: no samples were collected{}; {} not written",
            ending.why_empty,
            output.path.display()
        );
        return Ok(exit_code.unwrap_or(1));
    }
    write(output, &profile)?;
    if !output.is_stdout() {
        eprintln!("stackscope: wrote {}", output.written());
    }
    Ok(exit_code.unwrap_or(0))
}

/// The launched command's exit code, when it exited during the recording: its own, or a
/// shell's `128 + N` for a signal.
pub(crate) fn exit_code(recording: &Recording) -> Option<i32> {
    recording.exit_status.map(|status| match status.code() {
        Some(code) => code,
        None => 128 + killed_by(status).unwrap_or(0),
    })
}

/// The signal that ended a command, as a shell's `128 + N` counts it.
#[cfg(unix)]
fn killed_by(status: ExitStatus) -> Option<i32> {
    std::os::unix::process::ExitStatusExt::signal(&status)
}

/// Windows has no signals: every ending has an exit code.
#[cfg(not(unix))]
fn killed_by(_: ExitStatus) -> Option<i32> {
    None
}

/// Says why sampling stopped before its time, when it did.
pub(crate) fn say_failure(recording: &Recording) {
    if let Some(e) = &recording.failure {
        eprintln!("stackscope: sampling stopped early: {e}");
    }
}

/// What naming left out; then the figures of the source that sampled, each in one line.
fn say_figures(recording: &Recording) {
    say_naming();
    match &recording.figures {
        Some(SourceFigures::Bpf(figures)) => say_bpf_figures(figures),
        Some(SourceFigures::Gdb(rounds)) => eprintln!("{}", describe_rounds(rounds)),
        None => {}
    }
}

/// What the sampling program cost, when the kernel timed it, and what the kernel's count
/// table could not keep; the hints say why stacks were lost.
fn say_bpf_figures(figures: &BpfFigures) {
    if let Some(lead_in) = &figures.lead_in {
        eprintln!("{}", describe_lead_in(lead_in));
    }
    if figures.cost.runs > 0 {
        eprintln!("{}", describe_cost(&figures.cost));
    }
    // record has no storage flags: say what was lost in its own words.
    if figures.storage.counts_full {
        eprintln!(
            "stackscope: the kernel's count table filled up ({} entries), so samples of new \
             stacks were dropped; `stackscope profile --hash-storage-size` can keep more",
            figures.storage.count_entries
        );
    }
}

/// What naming did not use, in one line each: debug files of another build, and the names
/// not looked up after a Ctrl-C.
pub(crate) fn say_naming() {
    let mismatched = stackscope_symbols::foreign::mismatched_count();
    if mismatched > 0 {
        eprintln!(
            "stackscope: {mismatched} debug or binary file(s) left unused: their build-id or \
             debug-link CRC was not the one looked up (named above)"
        );
    }
    if stackscope_symbols::interrupt::interrupted() {
        eprintln!(
            "stackscope: naming stopped at the stop signal: frames not named by then show \
             their module and address"
        );
    }
}

/// The samples taken before the program took over, and how they were walked, in one line.
fn describe_lead_in(lead_in: &LeadInFigures) -> String {
    if lead_in.whole_run {
        return format!(
            "stackscope: the command ended before the eBPF program was ready: its {} samples \
             ({:.0} ms) were taken by perf_event and unwound here from stack copies: {} of {} \
             user stacks whole",
            lead_in.samples,
            lead_in.lasted.as_secs_f64() * 1e3,
            lead_in.complete,
            lead_in.user_stacks
        );
    }
    format!(
        "stackscope: the first {} samples ({:.0} ms, while the eBPF program was verified and \
         the command's unwind tables loaded) were taken by perf_event and unwound here from \
         stack copies: {} of {} user stacks whole",
        lead_in.samples,
        lead_in.lasted.as_secs_f64() * 1e3,
        lead_in.complete,
        lead_in.user_stacks
    )
}

/// The kernel's timing of the sampling program, in one line: what profiling cost the
/// profiled CPUs in the kernel (the rest of the cost is stackscope's own CPU time).
fn describe_cost(cost: &ProgramCost) -> String {
    format!(
        "in-kernel sampling: {} runs, {:.2} µs each, {:.1} ms of CPU in all",
        cost.runs,
        cost.run_time_ns as f64 / cost.runs as f64 / 1e3,
        cost.run_time_ns as f64 / 1e6
    )
}

/// What a stop-the-world source got and what the target paid: fresh stacks a second, the
/// share of the time the target was stopped, and a round's pause against the stub's floor;
/// then how fast it went and how long the target was held per round, where the pause went,
/// how long the target ran between rounds, and the looks left out.
fn describe_rounds(rounds: &Rounds) -> String {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let floor = match rounds.pause_over_floor() {
        Some(ratio) => format!(
            "pause {ratio:.2}x the stub's floor (median {:.3} ms against {:.3} ms for {} rounds that only stopped the guest, read its registers and resumed it)",
            ms(rounds.pause_median),
            ms(rounds.floor_median),
            rounds.floor_rounds,
        ),
        None => "no floor round measured (one round in 10 is one)".to_string(),
    };
    let mut text = format!(
        "stackscope: gdb: {:.1} fresh stacks/s (looks at a vCPU that ran since the round before); guest slowed {:.2}%: stopped {:.3} s of {:.3} s (--max-slowdown {:.1}%, {} rounds waited for it); {floor}\n",
        rounds.stacks_per_sec(),
        rounds.slowdown() * 100.0,
        rounds.paused.as_secs_f64(),
        rounds.elapsed.as_secs_f64(),
        rounds.max_slowdown * 100.0,
        rounds.late_rounds,
    );
    text.push_str(&format!(
        "stackscope: gdb: {} rounds, {} stacks in {:.3} s: {:.1} rounds/s, {:.1} stacks/s; guest paused per round: median {:.3} ms, p95 {:.3} ms, longest {:.3} ms",
        rounds.rounds,
        rounds.stacks,
        rounds.elapsed.as_secs_f64(),
        rounds.rounds_per_sec(),
        rounds.stacks_per_sec(),
        ms(rounds.pause_median),
        ms(rounds.pause_p95),
        ms(rounds.pause_longest),
    ));
    if !rounds.pause_steps.is_empty() {
        let steps: Vec<String> = rounds
            .pause_steps
            .iter()
            .map(|(step, d)| format!("{step} {:.3}", ms(*d)))
            .collect();
        text.push_str(&format!(
            "\nstackscope: gdb: pause by step (median ms): {}; guest ran {:.3} ms between rounds (median); {} looks at a vCPU that had not run since the round before were left out",
            steps.join(", "),
            ms(rounds.run_median),
            rounds.stale_looks,
        ));
    }
    text
}

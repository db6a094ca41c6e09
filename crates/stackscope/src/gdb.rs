//! `stackscope gdb`: sample a guest kernel in QEMU, or a program under gdbserver, over the GDB
//! remote protocol, then write the profile and how long the guest was held per round.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use indicatif::{ProgressBar, ProgressStyle};
use stackscope_gdb::{Client, Error, Image, Remote, SamplerOptions};

use crate::cli::{GdbArgs, GDB_FREQUENCY};
use crate::output::{Fallback, Output};
use crate::status::stop_on_signals;
use crate::summary::{self, Ending};

pub fn run(args: GdbArgs) -> Result<i32> {
    let (interval, frequency_hz) = pace(&args)?;
    let duration = args.duration.duration;
    if args.samples == Some(0) {
        bail!("--samples must be greater than zero");
    }

    let image = Image::open(&args.kernel)?;
    let remote = Remote::parse(&args.remote);
    let title = format!("stackscope: {} at {remote}", args.kernel.display());
    let output = Output::from_args(&args.output, Fallback::file(title))?;
    output.check_writable()?;

    let mut client = Client::connect(&remote, args.timeout)?;
    // Before sampling, the stub lists the program's libraries, which can take a while: Ctrl-C
    // and the duration end that too.
    let stop = stop_on_signals()?;
    client.set_stop(stop.clone());
    client.set_end(duration.map(|d| Instant::now() + d));
    let prepared = stackscope_gdb::prepare(&mut client, image, args.cpu_mask);
    if client.stopped() {
        eprintln!("stackscope: stopped before sampling began; nothing was sampled");
        return Ok(130);
    }
    let target = prepared?;

    eprintln!(
        "{}",
        announcement(&args, &target, &remote, interval, frequency_hz)
    );

    let progress = progress_bar(args.samples, duration);
    let options = SamplerOptions {
        interval,
        max_slowdown: args.max_slowdown / 100.0,
        interval_asked: args.frequency.frequency.is_some() || args.interval.is_some(),
        rounds: args.samples,
        duration,
        cpu_mask: args.cpu_mask,
        rust_clean: args.rust_clean,
        frequency_hz,
    };
    let recording = stackscope_gdb::record(&mut client, target, &options, &stop, |p| {
        if let Some(bar) = &progress {
            match (args.samples, duration) {
                (None, Some(_)) => bar.set_position(p.elapsed.as_millis() as u64),
                _ => bar.set_position(p.rounds),
            }
        }
    });
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    let recording = recording.map_err(|e| refusal(e, &args))?;
    let ending = Ending {
        command: &[],
        why_empty: "",
        off_cpu_hint: false,
    };
    summary::finish(recording, &output, ending, |output, profile| {
        output.write(profile)
    })
}

/// What is sampled, how often, for how long and how it is unwound, said once sampling starts.
fn announcement(
    args: &GdbArgs,
    target: &stackscope_gdb::sample::Target,
    remote: &Remote,
    interval: Duration,
    frequency_hz: Option<u64>,
) -> String {
    let rate = match frequency_hz {
        Some(hz) => format!("{hz} Hz"),
        None if interval.is_zero() => {
            format!("as often as --max-slowdown {}% allows", args.max_slowdown)
        }
        None => format!("every {} s", interval.as_secs_f64()),
    };
    let until = match (args.samples, args.duration.duration) {
        (Some(n), _) => format!("for {n} rounds"),
        (_, Some(d)) => format!("for {} s", d.as_secs_f64()),
        _ => "until Ctrl-C or the guest exits".to_string(),
    };
    let unwinding = if target.image().has_unwind_info() {
        "DWARF CFI"
    } else {
        "frame pointers (no .eh_frame/.debug_frame)"
    };
    format!(
        "stackscope: sampling {} of {} vCPU(s) at {remote} at {rate} {until}, unwinding by {unwinding}",
        target.sampled_vcpus(),
        target.vcpus(),
    )
}

/// The gap between rounds and the frequency it stands for (none for `--interval`).
fn pace(args: &GdbArgs) -> Result<(Duration, Option<u64>)> {
    Ok(match (args.frequency.frequency, args.interval) {
        (Some(0), _) => bail!("-F must be greater than zero (use --interval 0 for back to back)"),
        (Some(hz), _) => (Duration::from_secs_f64(1.0 / hz as f64), Some(hz)),
        (None, Some(interval)) => (interval, None),
        (None, None) => (
            Duration::from_secs_f64(1.0 / GDB_FREQUENCY as f64),
            Some(GDB_FREQUENCY),
        ),
    })
}

/// A refused rate in the flags' own terms: the -F or --interval that would keep within
/// --max-slowdown.
fn refusal(e: Error, args: &GdbArgs) -> anyhow::Error {
    let Error::TooFrequent {
        least_interval,
        pause,
        rounds,
        ..
    } = &e
    else {
        return e.into();
    };
    let (asked, allowed) = match args.frequency.frequency {
        Some(hz) => (
            format!("-F {hz}"),
            format!(
                "-F {} at most",
                (1.0 / least_interval.as_secs_f64()).floor().max(1.0)
            ),
        ),
        None => (
            format!(
                "--interval {}",
                args.interval.unwrap_or_default().as_secs_f64()
            ),
            format!("--interval {:.6} at least", least_interval.as_secs_f64()),
        ),
    };
    anyhow::anyhow!(
        "{asked} would stop the guest more than --max-slowdown {}% of the time: a round pauses it {:.3} ms here (median of the first {rounds}), so {allowed} (or raise --max-slowdown)",
        args.max_slowdown,
        pause.as_secs_f64() * 1e3,
    )
}

/// A bar on standard error when it is a terminal: by rounds, by time, or a spinner.
fn progress_bar(samples: Option<u64>, duration: Option<Duration>) -> Option<ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = match (samples, duration) {
        (Some(n), _) => ProgressBar::new(n).with_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} rounds {per_sec} ({eta})").ok()?,
        ),
        (None, Some(d)) => ProgressBar::new(d.as_millis() as u64)
            .with_style(ProgressStyle::with_template("{bar:40} {elapsed}/{duration}").ok()?),
        _ => ProgressBar::new_spinner().with_style(
            ProgressStyle::with_template("{spinner} {pos} rounds {per_sec} {elapsed}").ok()?,
        ),
    };
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    Some(bar)
}

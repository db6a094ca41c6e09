//! What `top` shows, whichever way it is drawn: the profile so far as the naming step hands it
//! over (frames, stacks, threads, each once), each refresh's stacks kept for the window, and
//! from them the rows of functions with self and total counts (`report --top`'s one rule),
//! sorted, filtered, grouped by process or thread, with or without kernel frames, and a row's
//! callers and callees.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use stackscope_profile::format::top::{count_stack, Counts};
use stackscope_profile::{printable, Frame, FrameId, StackId, Thread, ThreadId};

/// Refreshes a row's history (its sparkline) spans.
pub(crate) const HISTORY: usize = 20;

/// What the naming step added to the profile so far since the last update, and one hand-over's
/// stacks.
pub(crate) struct Update {
    pub frames: Vec<Frame>,
    pub stacks: Vec<Vec<FrameId>>,
    pub threads: Vec<Thread>,
    pub interval: stackscope_stacks::table::Interval,
    /// Whole user stacks, and user stacks, counted since the start.
    pub complete: (u64, u64),
    /// Samples counted as their leaf alone, past the distinct stacks kept, since the start.
    pub past_kept: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum SortBy {
    Own,
    Total,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Grouping {
    None,
    Process,
    Thread,
}

impl Grouping {
    pub fn next(self) -> Grouping {
        match self {
            Grouping::None => Grouping::Process,
            Grouping::Process => Grouping::Thread,
            Grouping::Thread => Grouping::None,
        }
    }
}

/// How the rows are chosen and counted.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(crate) struct Settings {
    pub sort: SortBy,
    pub kernel: bool,
    pub grouping: Grouping,
    pub cumulative: bool,
    /// Functions whose name holds this (any case) are shown; empty: all.
    pub filter: String,
}

/// A row's function, within its process or thread when grouped (else group 0).
pub(crate) type Key = (u32, u32);

/// One function as rows name it: frames differing only in line are one function.
struct Function {
    name: String,
    module: String,
    kernel: bool,
}

/// One refresh's stacks.
struct Bucket {
    stacks: Vec<(ThreadId, StackId, u64)>,
    lost: u64,
    /// Its counts under the settings of `View::version`.
    counts: HashMap<Key, Counts>,
    total: u64,
}

/// A row as drawn.
pub(crate) struct Row {
    pub key: Key,
    pub name: String,
    pub module: String,
    /// The process or thread it belongs to, when grouped.
    pub group: Option<String>,
    pub counts: Counts,
    /// Its self share (0 to 1) in each of the last refreshes, oldest first.
    pub history: Vec<f64>,
}

/// The rows and the figures above them.
pub(crate) struct Table {
    pub rows: Vec<Row>,
    /// Samples counted (of the window, or since the start).
    pub total: u64,
    pub lost: u64,
    /// Seconds the counts span.
    pub seconds: f64,
}

/// A row's hottest callers and callees, with the samples through each.
pub(crate) struct Neighbours {
    pub callers: Vec<(String, u64)>,
    pub callees: Vec<(String, u64)>,
}

pub(crate) struct View {
    pub settings: Settings,
    function_of: Vec<u32>,
    functions: Vec<Function>,
    function_ids: HashMap<(String, String), u32>,
    stacks: Vec<Vec<FrameId>>,
    threads: Vec<Thread>,
    buckets: VecDeque<Bucket>,
    /// Refreshes the window holds.
    window: usize,
    refresh: Duration,
    /// Every stack's samples since the start, and their counts under the settings.
    all: HashMap<(ThreadId, StackId), u64>,
    all_counts: HashMap<Key, Counts>,
    all_total: u64,
    all_lost: u64,
    refreshes: u64,
    pub complete: (u64, u64),
    pub past_kept: u64,
    /// The settings the buckets' counts were made under.
    counted_as: Settings,
}

impl View {
    pub fn new(settings: Settings, refresh: Duration, window: Duration) -> View {
        let window = (window.as_secs_f64() / refresh.as_secs_f64())
            .ceil()
            .max(1.0) as usize;
        View {
            counted_as: settings.clone(),
            settings,
            function_of: Vec::new(),
            functions: Vec::new(),
            function_ids: HashMap::new(),
            stacks: Vec::new(),
            threads: Vec::new(),
            buckets: VecDeque::new(),
            window,
            refresh,
            all: HashMap::new(),
            all_counts: HashMap::new(),
            all_total: 0,
            all_lost: 0,
            refreshes: 0,
            complete: (0, 0),
            past_kept: 0,
        }
    }

    /// Takes in what the naming step handed over; its stacks join the refresh under way.
    pub fn update(&mut self, update: Update) {
        for frame in update.frames {
            let module = frame.module.as_deref().map(printable).unwrap_or_default();
            let key = (frame.shown_name().into_owned(), module.into_owned());
            let next = self.functions.len() as u32;
            let id = *self.function_ids.entry(key.clone()).or_insert(next);
            if id == next {
                self.functions.push(Function {
                    name: key.0,
                    module: key.1,
                    kernel: frame.is_kernel(),
                });
            }
            self.function_of.push(id);
        }
        self.stacks.extend(update.stacks);
        self.threads.extend(update.threads);
        self.complete = update.complete;
        self.past_kept = update.past_kept;
        if self.buckets.is_empty() {
            self.rotate();
        }
        let counts = self.count(&update.interval.stacks);
        let bucket = self.buckets.back_mut().expect("a bucket under way");
        merge(&mut bucket.counts, &counts.0);
        bucket.total += counts.1;
        bucket.lost += update.interval.lost;
        bucket.stacks.extend(update.interval.stacks.iter().copied());
        merge(&mut self.all_counts, &counts.0);
        self.all_total += counts.1;
        self.all_lost += update.interval.lost;
        for (thread, stack, n) in update.interval.stacks {
            *self.all.entry((thread, stack)).or_default() += n;
        }
    }

    /// Starts the next refresh's bucket, letting go of what neither the window nor the
    /// history needs.
    pub fn rotate(&mut self) {
        self.refreshes += 1;
        self.buckets.push_back(Bucket {
            stacks: Vec::new(),
            lost: 0,
            counts: HashMap::new(),
            total: 0,
        });
        while self.buckets.len() > self.window.max(HISTORY) + 1 {
            self.buckets.pop_front();
        }
    }

    /// The counts of `stacks` under the settings: per key, and the samples counted.
    fn count(&self, stacks: &[(ThreadId, StackId, u64)]) -> (HashMap<Key, Counts>, u64) {
        let mut counts = HashMap::new();
        let mut on_stack = HashSet::new();
        let mut chain = Vec::new();
        let mut total = 0;
        for &(thread, stack, n) in stacks {
            let group = self.group_of(thread);
            chain.clear();
            chain.extend(self.chain(stack).map(|f| (group, f)));
            if chain.is_empty() {
                continue;
            }
            total += n;
            count_stack(&mut counts, chain.drain(..), n, &mut on_stack);
        }
        (counts, total)
    }

    /// A stack's functions, root first, without kernel ones when they are hidden.
    fn chain(&self, stack: StackId) -> impl Iterator<Item = u32> + '_ {
        let frames = self.stacks.get(stack as usize).map_or(&[][..], |s| &s[..]);
        frames
            .iter()
            .map(|&f| self.function_of[f as usize])
            .filter(|&f| self.settings.kernel || !self.functions[f as usize].kernel)
    }

    fn group_of(&self, thread: ThreadId) -> u32 {
        let thread = &self.threads[thread as usize];
        match self.settings.grouping {
            Grouping::None => 0,
            Grouping::Process => thread.pid,
            Grouping::Thread => thread.tid,
        }
    }

    fn group_name(&self, group: u32) -> Option<String> {
        let of = |t: &&Thread| match self.settings.grouping {
            Grouping::Process => t.pid == group,
            _ => t.tid == group,
        };
        match self.settings.grouping {
            Grouping::None => None,
            Grouping::Process => Some(match self.threads.iter().find(of) {
                Some(t) => format!("{} {}", t.pid, printable(&t.process_name)),
                None => group.to_string(),
            }),
            Grouping::Thread => Some(match self.threads.iter().find(of) {
                Some(t) => format!("{} {}", t.tid, printable(&t.comm)),
                None => group.to_string(),
            }),
        }
    }

    /// Counts everything anew when the settings that count changed (not sort or filter).
    fn recount(&mut self) {
        let same = |a: &Settings, b: &Settings| a.kernel == b.kernel && a.grouping == b.grouping;
        if same(&self.settings, &self.counted_as) {
            return;
        }
        self.counted_as = self.settings.clone();
        for i in 0..self.buckets.len() {
            let (counts, total) = self.count(&self.buckets[i].stacks);
            let bucket = &mut self.buckets[i];
            bucket.counts = counts;
            bucket.total = total;
        }
        let all: Vec<_> = self.all.iter().map(|(&(t, s), &n)| (t, s, n)).collect();
        (self.all_counts, self.all_total) = self.count(&all);
    }

    /// The rows and figures as the settings ask.
    pub fn table(&mut self) -> Table {
        self.recount();
        let in_window = self.buckets.len().min(self.window);
        let window = self.buckets.iter().skip(self.buckets.len() - in_window);
        let (counts, total, lost, seconds) = if self.settings.cumulative {
            let seconds = self.refreshes as f64 * self.refresh.as_secs_f64();
            (
                self.all_counts.clone(),
                self.all_total,
                self.all_lost,
                seconds,
            )
        } else {
            let mut counts = HashMap::new();
            let (mut total, mut lost) = (0, 0);
            for bucket in window {
                merge(&mut counts, &bucket.counts);
                total += bucket.total;
                lost += bucket.lost;
            }
            (
                counts,
                total,
                lost,
                in_window as f64 * self.refresh.as_secs_f64(),
            )
        };
        let filter = self.settings.filter.to_lowercase();
        let mut rows: Vec<Row> = counts
            .into_iter()
            .filter(|(key, _)| {
                filter.is_empty()
                    || self.functions[key.1 as usize]
                        .name
                        .to_lowercase()
                        .contains(&filter)
            })
            .map(|(key, counts)| Row {
                key,
                name: self.functions[key.1 as usize].name.clone(),
                module: self.functions[key.1 as usize].module.clone(),
                group: self.group_name(key.0),
                counts,
                history: self.history(key),
            })
            .collect();
        let sort = self.settings.sort;
        let rank = |c: &Counts| match sort {
            SortBy::Own => (c.own, c.total),
            SortBy::Total => (c.total, c.own),
        };
        rows.sort_by(|a, b| {
            rank(&b.counts)
                .cmp(&rank(&a.counts))
                .then_with(|| a.name.cmp(&b.name))
        });
        Table {
            rows,
            total,
            lost,
            seconds,
        }
    }

    /// A key's self share in each of the last refreshes (the one under way left out).
    fn history(&self, key: Key) -> Vec<f64> {
        let done = self.buckets.len().saturating_sub(1);
        let first = done.saturating_sub(HISTORY);
        (first..done)
            .map(|i| &self.buckets[i])
            .map(|b| match (b.counts.get(&key), b.total) {
                (Some(c), total) if total > 0 => c.own as f64 / total as f64,
                _ => 0.0,
            })
            .collect()
    }

    /// The hottest callers and callees of `key` over what the table counts, `most` of each.
    pub fn neighbours(&self, key: Key, most: usize) -> Neighbours {
        let mut callers: HashMap<Option<u32>, u64> = HashMap::new();
        let mut callees: HashMap<Option<u32>, u64> = HashMap::new();
        let mut note = |thread: ThreadId, stack: StackId, n: u64| {
            if self.group_of(thread) != key.0 {
                return;
            }
            let chain: Vec<u32> = self.chain(stack).collect();
            if let Some(i) = chain.iter().position(|&f| f == key.1) {
                let caller = i.checked_sub(1).map(|c| chain[c]);
                *callers.entry(caller).or_default() += n;
                *callees.entry(chain.get(i + 1).copied()).or_default() += n;
            }
        };
        if self.settings.cumulative {
            for (&(t, s), &n) in &self.all {
                note(t, s, n);
            }
        } else {
            let in_window = self.buckets.len().min(self.window);
            for bucket in self.buckets.iter().skip(self.buckets.len() - in_window) {
                for &(t, s, n) in &bucket.stacks {
                    note(t, s, n);
                }
            }
        }
        let named = |map: HashMap<Option<u32>, u64>, none: &str| {
            let mut list: Vec<(String, u64)> = map
                .into_iter()
                .map(|(f, n)| match f {
                    Some(f) => (self.functions[f as usize].name.clone(), n),
                    None => (none.to_string(), n),
                })
                .collect();
            list.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            list.truncate(most);
            list
        };
        Neighbours {
            callers: named(callers, "[root]"),
            callees: named(callees, "[self]"),
        }
    }
}

fn merge(into: &mut HashMap<Key, Counts>, from: &HashMap<Key, Counts>) {
    for (key, counts) in from {
        let sum = into.entry(*key).or_default();
        sum.own += counts.own;
        sum.total += counts.total;
    }
}

//! The ETW trace session: a private system-trace session of our own name (so WPR, xperf and
//! the "NT Kernel Logger" keep running), the kernel's profile, image, process and thread
//! events with the stack of every SampledProfile event, and a consumer thread handing each
//! event of those kinds over a channel.

use std::mem::size_of;
use std::ptr::null;
use std::sync::mpsc::Sender;
use std::thread::JoinHandle;

use windows_sys::core::GUID;
use windows_sys::Win32::Foundation::{GetLastError, ERROR_SUCCESS};
use windows_sys::Win32::System::Diagnostics::Etw::{
    CloseTrace, ControlTraceW, OpenTraceW, ProcessTrace, StartTraceW, TraceQueryInformation,
    TraceSampledProfileIntervalInfo, TraceSetInformation, TraceStackTracingInfo, CLASSIC_EVENT_ID,
    CONTROLTRACE_HANDLE, EVENT_HEADER_FLAG_32_BIT_HEADER, EVENT_RECORD, EVENT_TRACE_CONTROL_STOP,
    EVENT_TRACE_FLAG_IMAGE_LOAD, EVENT_TRACE_FLAG_PROCESS, EVENT_TRACE_FLAG_PROFILE,
    EVENT_TRACE_FLAG_THREAD, EVENT_TRACE_LOGFILEW, EVENT_TRACE_PROPERTIES,
    EVENT_TRACE_REAL_TIME_MODE, EVENT_TRACE_SYSTEM_LOGGER_MODE, PROCESSTRACE_HANDLE,
    PROCESS_TRACE_MODE_EVENT_RECORD, PROCESS_TRACE_MODE_RAW_TIMESTAMP,
    PROCESS_TRACE_MODE_REAL_TIME, TRACE_PROFILE_INTERVAL, WNODE_FLAG_TRACED_GUID,
};

use crate::error::{Error, SESSION_NAME};
use crate::event::{opcode, provider, Header};

/// One event of a kind the source uses, as the consumer thread hands it over.
pub(super) struct RawEvent {
    pub header: Header,
    pub payload: Vec<u8>,
}

/// The providers whose events cross the channel; the rest are dropped in the callback.
const USED: [u128; 5] = [
    provider::PERF_INFO,
    provider::STACK_WALK,
    provider::IMAGE,
    provider::PROCESS,
    provider::THREAD,
];

/// OpenTraceW's failure value.
const INVALID_PROCESSTRACE_HANDLE: u64 = u64::MAX;

/// The properties block StartTrace and ControlTrace take: the structure, then room for the
/// session's name.
#[repr(C)]
struct Properties {
    props: EVENT_TRACE_PROPERTIES,
    name: [u16; 64],
}

impl Properties {
    fn new() -> Box<Self> {
        let mut p = Box::new(Properties {
            props: EVENT_TRACE_PROPERTIES::default(),
            name: [0; 64],
        });
        p.props.Wnode.BufferSize = size_of::<Properties>() as u32;
        p.props.Wnode.Flags = WNODE_FLAG_TRACED_GUID;
        // QueryPerformanceCounter time stamps: the finest clock; only compared, never shown.
        p.props.Wnode.ClientContext = 1;
        p.props.Wnode.Guid = session_guid();
        p.props.LogFileMode = EVENT_TRACE_REAL_TIME_MODE | EVENT_TRACE_SYSTEM_LOGGER_MODE;
        p.props.EnableFlags = EVENT_TRACE_FLAG_PROFILE
            | EVENT_TRACE_FLAG_IMAGE_LOAD
            | EVENT_TRACE_FLAG_PROCESS
            | EVENT_TRACE_FLAG_THREAD;
        // Buffers in KB: room for a few seconds of stacks at 8 kHz on many CPUs.
        p.props.BufferSize = 1024;
        p.props.MinimumBuffers = 64;
        p.props.MaximumBuffers = 256;
        p.props.FlushTimer = 1;
        p.props.LoggerNameOffset = size_of::<EVENT_TRACE_PROPERTIES>() as u32;
        p
    }
}

/// A session GUID of our own (a system logger in its own name needs one), from the time and
/// our pid.
fn session_guid() -> GUID {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let pid = u128::from(std::process::id());
    GUID::from_u128(0x57ac_5c09_e000_4000_8000_0000_0000_0000 ^ (nanos << 16) ^ pid)
}

fn wide(s: &str) -> Vec<u16> {
    s.encode_utf16().chain([0]).collect()
}

fn check(call: &'static str, code: u32) -> Result<(), Error> {
    match code {
        ERROR_SUCCESS => Ok(()),
        code => Err(Error::from_code(call, code)),
    }
}

/// The running session; stopped when dropped.
pub(super) struct Trace {
    handle: CONTROLTRACE_HANDLE,
    props: Box<Properties>,
    stopped: bool,
    consumer: Option<JoinHandle<()>>,
}

/// What the session could not keep, read when it stops.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Losses {
    pub events: u32,
    pub buffers: u32,
}

impl Trace {
    pub(super) fn start() -> Result<Trace, Error> {
        let mut props = Properties::new();
        let name = wide(SESSION_NAME);
        let mut handle = CONTROLTRACE_HANDLE { Value: 0 };
        // SAFETY: `props` is a properties block with room for the name at LoggerNameOffset;
        // `name` is NUL-terminated.
        let code = unsafe { StartTraceW(&mut handle, name.as_ptr(), &mut props.props) };
        check("StartTraceW", code)?;
        let trace = Trace {
            handle,
            props,
            stopped: false,
            consumer: None,
        };
        trace.trace_stacks_of_samples()?;
        Ok(trace)
    }

    /// Asks for the stack of every SampledProfile event (kernel and user parts).
    fn trace_stacks_of_samples(&self) -> Result<(), Error> {
        let id = CLASSIC_EVENT_ID {
            EventGuid: GUID::from_u128(provider::PERF_INFO),
            Type: opcode::SAMPLED_PROFILE,
            Reserved: [0; 7],
        };
        // SAFETY: one CLASSIC_EVENT_ID, its size given.
        let code = unsafe {
            TraceSetInformation(
                self.handle,
                TraceStackTracingInfo,
                (&raw const id).cast(),
                size_of::<CLASSIC_EVENT_ID>() as u32,
            )
        };
        check("TraceSetInformation", code)
    }

    /// Starts the consumer thread, which sends every used event to `events` until the
    /// session stops.
    pub(super) fn consume(&mut self, events: Sender<RawEvent>) -> Result<(), Error> {
        let mut name = wide(SESSION_NAME);
        let context = Box::into_raw(Box::new(events));
        let mut logfile = EVENT_TRACE_LOGFILEW {
            LoggerName: name.as_mut_ptr(),
            Context: context.cast(),
            ..EVENT_TRACE_LOGFILEW::default()
        };
        // Raw time stamps: a StackWalk event names its sample by the sample's raw time stamp,
        // which the header's must match rather than be converted to system time.
        logfile.Anonymous1.ProcessTraceMode = PROCESS_TRACE_MODE_REAL_TIME
            | PROCESS_TRACE_MODE_EVENT_RECORD
            | PROCESS_TRACE_MODE_RAW_TIMESTAMP;
        logfile.Anonymous2.EventRecordCallback = Some(on_event);
        // SAFETY: `logfile` names our real-time session and a callback; the context lives
        // until the consumer thread ends.
        let handle = unsafe { OpenTraceW(&mut logfile) };
        if handle.Value == INVALID_PROCESSTRACE_HANDLE {
            // SAFETY: reads the calling thread's last error; `context` was never handed out.
            let code = unsafe { GetLastError() };
            drop(unsafe { Box::from_raw(context) });
            return Err(Error::from_code("OpenTraceW", code));
        }
        let context = context as usize;
        self.consumer = Some(std::thread::spawn(move || {
            let handle = PROCESSTRACE_HANDLE {
                Value: handle.Value,
            };
            // SAFETY: blocks delivering events until the session stops; then the handle is
            // closed and the context, no longer used by any callback, freed.
            unsafe {
                ProcessTrace(&handle, 1, null(), null());
                CloseTrace(handle);
                drop(Box::from_raw(context as *mut Sender<RawEvent>));
            }
        }));
        Ok(())
    }

    /// Stops the session and waits for the consumer to deliver what was buffered.
    pub(super) fn stop(mut self) -> Losses {
        self.stop_session();
        if let Some(consumer) = self.consumer.take() {
            let _ = consumer.join();
        }
        Losses {
            events: self.props.props.EventsLost,
            buffers: self.props.props.RealTimeBuffersLost,
        }
    }

    fn stop_session(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        // SAFETY: our session's handle and its properties block, which receives the final
        // figures.
        unsafe {
            ControlTraceW(
                self.handle,
                null(),
                &mut self.props.props,
                EVENT_TRACE_CONTROL_STOP,
            );
        }
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        self.stop_session();
    }
}

/// Called on the consumer thread for every event.
unsafe extern "system" fn on_event(record: *mut EVENT_RECORD) {
    // SAFETY: ETW passes a valid record for the duration of the call.
    let Some(record) = (unsafe { record.as_ref() }) else {
        return;
    };
    let h = &record.EventHeader;
    let provider = guid_value(&h.ProviderId);
    if !USED.contains(&provider) || record.UserContext.is_null() {
        return;
    }
    // SAFETY: the context is the sender `consume` boxed, alive while events are delivered.
    let events = unsafe { &*(record.UserContext as *const Sender<RawEvent>) };
    let payload = if record.UserData.is_null() {
        Vec::new()
    } else {
        // SAFETY: UserData holds UserDataLength bytes for the duration of the call.
        unsafe {
            std::slice::from_raw_parts(
                record.UserData as *const u8,
                usize::from(record.UserDataLength),
            )
        }
        .to_vec()
    };
    let header = Header {
        provider,
        opcode: h.EventDescriptor.Opcode,
        version: h.EventDescriptor.Version,
        timestamp: h.TimeStamp as u64,
        pid: h.ProcessId,
        tid: h.ThreadId,
        // SAFETY: both views of the union are plain integers.
        cpu: unsafe { record.BufferContext.Anonymous.ProcessorIndex },
        pointer_size: if u32::from(h.Flags) & EVENT_HEADER_FLAG_32_BIT_HEADER != 0 {
            4
        } else {
            8
        },
    };
    let _ = events.send(RawEvent { header, payload });
}

fn guid_value(g: &GUID) -> u128 {
    (u128::from(g.data1) << 96)
        | (u128::from(g.data2) << 80)
        | (u128::from(g.data3) << 64)
        | u128::from(u64::from_be_bytes(g.data4))
}

/// The system-wide profile timer interval, set for the recording and put back after it.
pub(super) struct Interval {
    previous: Option<TRACE_PROFILE_INTERVAL>,
    /// The rate the kernel runs the timer at, read back: it keeps the interval within what
    /// its timer allows.
    pub hz: Option<f64>,
}

impl Interval {
    /// Sets the profile timer to `hz` (in 100 ns units, as the kernel takes it; it rounds to
    /// what its timer allows). Needs SeSystemProfilePrivilege enabled.
    pub(super) fn set(hz: u32) -> Result<Interval, Error> {
        let previous = query_interval();
        set_interval(TRACE_PROFILE_INTERVAL {
            Source: 0,
            Interval: (10_000_000 / hz.max(1)).max(1),
        })?;
        let hz = query_interval().map(|set| 10_000_000.0 / f64::from(set.Interval));
        Ok(Interval { previous, hz })
    }
}

impl Drop for Interval {
    fn drop(&mut self) {
        if let Some(previous) = self.previous {
            let _ = set_interval(previous);
        }
    }
}

fn set_interval(interval: TRACE_PROFILE_INTERVAL) -> Result<(), Error> {
    // SAFETY: one TRACE_PROFILE_INTERVAL, its size given; handle 0 sets the system's timer.
    let code = unsafe {
        TraceSetInformation(
            CONTROLTRACE_HANDLE { Value: 0 },
            TraceSampledProfileIntervalInfo,
            (&raw const interval).cast(),
            size_of::<TRACE_PROFILE_INTERVAL>() as u32,
        )
    };
    check("TraceSetInformation", code)
}

fn query_interval() -> Option<TRACE_PROFILE_INTERVAL> {
    let mut interval = TRACE_PROFILE_INTERVAL::default();
    let mut len = 0u32;
    // SAFETY: room for one TRACE_PROFILE_INTERVAL, its size given.
    let code = unsafe {
        TraceQueryInformation(
            CONTROLTRACE_HANDLE { Value: 0 },
            TraceSampledProfileIntervalInfo,
            (&raw mut interval).cast(),
            size_of::<TRACE_PROFILE_INTERVAL>() as u32,
            &mut len,
        )
    };
    (code == ERROR_SUCCESS && interval.Interval != 0).then_some(interval)
}

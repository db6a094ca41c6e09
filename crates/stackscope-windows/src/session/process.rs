//! The processes a recording profiles, as Windows hands them: the profiling privilege, a
//! command started suspended and resumed once the session delivers events, processes attached
//! to by pid, and the drive letters' devices that image paths are logged under.

use std::ffi::OsString;
use std::os::windows::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::ptr::null;

use windows_sys::Win32::Foundation::{
    CloseHandle, GetLastError, ERROR_SUCCESS, HANDLE, INVALID_HANDLE_VALUE, LUID, WAIT_OBJECT_0,
};
use windows_sys::Win32::Security::{
    AdjustTokenPrivileges, LookupPrivilegeValueW, LUID_AND_ATTRIBUTES, SE_PRIVILEGE_ENABLED,
    SE_SYSTEM_PROFILE_NAME, TOKEN_ADJUST_PRIVILEGES, TOKEN_PRIVILEGES, TOKEN_QUERY,
};
use windows_sys::Win32::Storage::FileSystem::QueryDosDeviceW;
use windows_sys::Win32::System::Diagnostics::ToolHelp::{
    CreateToolhelp32Snapshot, Thread32First, Thread32Next, TH32CS_SNAPTHREAD, THREADENTRY32,
};
use windows_sys::Win32::System::Performance::QueryPerformanceFrequency;
use windows_sys::Win32::System::SystemInformation::GetWindowsDirectoryW;
use windows_sys::Win32::System::Threading::{
    GetCurrentProcess, OpenProcess, OpenProcessToken, OpenThread, ResumeThread,
    WaitForSingleObject, CREATE_SUSPENDED, PROCESS_SYNCHRONIZE, THREAD_SUSPEND_RESUME,
};

use crate::error::Error;
use crate::paths::DevicePaths;

/// A handle closed when dropped.
struct Owned(HANDLE);

impl Drop for Owned {
    fn drop(&mut self) {
        // SAFETY: a handle this process opened and nothing else closes.
        unsafe { CloseHandle(self.0) };
    }
}

fn last_error() -> u32 {
    // SAFETY: reads the calling thread's last error.
    unsafe { GetLastError() }
}

/// Enables SeSystemProfilePrivilege, which setting the profile timer needs; an
/// administrator's token holds it disabled, anyone else's not at all.
pub(super) fn enable_profile_privilege() -> Result<(), Error> {
    let mut token: HANDLE = std::ptr::null_mut();
    // SAFETY: our own process's token, opened to adjust privileges.
    if unsafe {
        OpenProcessToken(
            GetCurrentProcess(),
            TOKEN_ADJUST_PRIVILEGES | TOKEN_QUERY,
            &mut token,
        )
    } == 0
    {
        return Err(Error::from_code("OpenProcessToken", last_error()));
    }
    let token = Owned(token);
    let mut luid = LUID::default();
    // SAFETY: a constant privilege name and room for its LUID.
    if unsafe { LookupPrivilegeValueW(null(), SE_SYSTEM_PROFILE_NAME, &mut luid) } == 0 {
        return Err(Error::from_code("LookupPrivilegeValueW", last_error()));
    }
    let privileges = TOKEN_PRIVILEGES {
        PrivilegeCount: 1,
        Privileges: [LUID_AND_ATTRIBUTES {
            Luid: luid,
            Attributes: SE_PRIVILEGE_ENABLED,
        }],
    };
    // SAFETY: one privilege to enable; the previous state is not wanted.
    let ok = unsafe {
        AdjustTokenPrivileges(
            token.0,
            0,
            &privileges,
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    // It succeeds without enabling a privilege the token lacks, saying so in the last error.
    match (ok, last_error()) {
        (0, code) => Err(Error::from_code("AdjustTokenPrivileges", code)),
        (_, ERROR_SUCCESS) => Ok(()),
        (_, code) => Err(Error::from_code("AdjustTokenPrivileges", code)),
    }
}

/// Starts `command` with its first thread suspended, so that nothing it runs escapes the
/// session.
pub(super) fn launch_suspended(command: &[OsString]) -> Result<Child, Error> {
    let shown = command
        .iter()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    let (program, args) = command.split_first().ok_or_else(|| Error::Launch {
        command: shown.clone(),
        error: std::io::Error::new(std::io::ErrorKind::InvalidInput, "no command given"),
    })?;
    Command::new(program)
        .args(args)
        .creation_flags(CREATE_SUSPENDED)
        .spawn()
        .map_err(|error| Error::Launch {
            command: shown,
            error,
        })
}

/// Resumes every thread of process `pid` (a process started suspended has one).
pub(super) fn resume(pid: u32) -> Result<(), Error> {
    // SAFETY: a snapshot of the system's threads.
    let snapshot = unsafe { CreateToolhelp32Snapshot(TH32CS_SNAPTHREAD, 0) };
    if snapshot == INVALID_HANDLE_VALUE {
        return Err(Error::from_code("CreateToolhelp32Snapshot", last_error()));
    }
    let snapshot = Owned(snapshot);
    let mut entry = THREADENTRY32 {
        dwSize: std::mem::size_of::<THREADENTRY32>() as u32,
        ..THREADENTRY32::default()
    };
    // SAFETY: walks the snapshot with an entry of the size it states.
    let mut more = unsafe { Thread32First(snapshot.0, &mut entry) } != 0;
    while more {
        if entry.th32OwnerProcessID == pid {
            // SAFETY: a thread of the process we started, opened only to resume it.
            let thread = unsafe { OpenThread(THREAD_SUSPEND_RESUME, 0, entry.th32ThreadID) };
            if thread.is_null() {
                return Err(Error::from_code("OpenThread", last_error()));
            }
            let thread = Owned(thread);
            // SAFETY: a thread handle with THREAD_SUSPEND_RESUME.
            if unsafe { ResumeThread(thread.0) } == u32::MAX {
                return Err(Error::from_code("ResumeThread", last_error()));
            }
        }
        // SAFETY: as above.
        more = unsafe { Thread32Next(snapshot.0, &mut entry) } != 0;
    }
    Ok(())
}

/// Processes attached to by pid, to know when they have all exited.
pub(super) struct Attached {
    handles: Vec<Owned>,
}

impl Attached {
    pub(super) fn open(pids: &[u32]) -> Result<Attached, Error> {
        let mut handles = Vec::with_capacity(pids.len());
        for &pid in pids {
            // SAFETY: opened only to wait for the process's end.
            let handle = unsafe { OpenProcess(PROCESS_SYNCHRONIZE, 0, pid) };
            if handle.is_null() {
                return Err(Error::NoProcess(pid));
            }
            handles.push(Owned(handle));
        }
        Ok(Attached { handles })
    }

    pub(super) fn all_exited(&self) -> bool {
        self.handles.iter().all(|h| {
            // SAFETY: a process handle with SYNCHRONIZE; a zero timeout only polls.
            unsafe { WaitForSingleObject(h.0, 0) == WAIT_OBJECT_0 }
        })
    }
}

/// A launched command's exit, once it has exited.
pub(super) fn exited(child: &mut Child) -> Option<ExitStatus> {
    child.try_wait().ok().flatten()
}

/// The device under each drive letter and the Windows directory, to turn logged image paths
/// into paths the symbolizer opens.
pub(super) fn device_paths() -> DevicePaths {
    let mut drives = Vec::new();
    let mut buf = [0u16; 512];
    for letter in b'A'..=b'Z' {
        let drive = format!("{}:", letter as char);
        let name: Vec<u16> = drive.encode_utf16().chain([0]).collect();
        // SAFETY: a NUL-terminated drive name and a buffer of the length given.
        let len = unsafe { QueryDosDeviceW(name.as_ptr(), buf.as_mut_ptr(), buf.len() as u32) };
        if len == 0 {
            continue;
        }
        // The answer is a list of NUL-terminated names; the first is the device.
        let first = buf.iter().position(|&u| u == 0).unwrap_or(0);
        drives.push((String::from_utf16_lossy(&buf[..first]), drive));
    }
    // SAFETY: a buffer of the length given.
    let len = unsafe { GetWindowsDirectoryW(buf.as_mut_ptr(), buf.len() as u32) } as usize;
    let windows = (len > 0 && len < buf.len()).then(|| String::from_utf16_lossy(&buf[..len]));
    DevicePaths::new(drives, windows)
}

/// Event time stamps per second: the session stamps events with QueryPerformanceCounter.
pub(super) fn ticks_per_second() -> u64 {
    let mut frequency = 0i64;
    // SAFETY: writes one integer.
    unsafe { QueryPerformanceFrequency(&mut frequency) };
    // Windows 10 and later count at 10 MHz.
    u64::try_from(frequency)
        .ok()
        .filter(|&f| f > 0)
        .unwrap_or(10_000_000)
}

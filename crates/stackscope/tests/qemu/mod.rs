//! The guest side of the `stackscope gdb` tests: builds the test kernel (`tests/guest/`) of
//! an architecture once per test binary, boots it in QEMU (software emulation) with the GDB
//! stub on a loopback port or a Unix socket, and reads what it measured of itself
//! ([`measure`]). A booted guest is killed when its [`Qemu`] is dropped, also when a test
//! panics.
#![allow(dead_code)]

mod measure;
// Not every test file reads what the guest measured.
#[allow(unused_imports)]
pub use measure::*;

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// What the kernel writes to the serial port once every CPU runs its work loop.
pub const RUNNING_LINE: &str = "cpus running";

/// Booting under software emulation on a loaded two-core machine can be slow; past this the
/// guest is taken as broken.
const BOOT_DEADLINE: Duration = Duration::from_secs(60);

/// The guest's architecture, each with its QEMU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    X86_64,
    Riscv64,
    Aarch64,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Riscv64 => "riscv64",
            Arch::Aarch64 => "aarch64",
        }
    }

    /// The directory holding both builds of this architecture's kernel; builds them on first
    /// use in this test binary.
    fn kernels(self) -> &'static Path {
        static BUILT: [OnceLock<PathBuf>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
        BUILT[self as usize].get_or_init(|| {
            let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
            let dir = tmp.join(format!("guest-kernel-{}", self.name()));
            let build_sh = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/guest/build.sh");
            let mut build = Command::new("bash");
            build.arg(build_sh).arg(self.name()).arg(&dir);
            stackscope_testkit::run(&mut build);
            dir
        })
    }

    /// QEMU for this architecture, with its machine.
    fn qemu(self) -> Command {
        let mut qemu = Command::new(format!("qemu-system-{}", self.name()));
        match self {
            Arch::X86_64 => {}
            Arch::Riscv64 => {
                qemu.args(["-machine", "virt", "-bios", "none"]);
            }
            Arch::Aarch64 => {
                qemu.args(["-machine", "virt", "-cpu", "cortex-a57"]);
            }
        }
        qemu
    }
}

/// The two builds of the test kernel.
#[derive(Clone, Copy, Debug)]
pub enum Kernel {
    /// `-fno-omit-frame-pointer` and no `.eh_frame`: unwound by the frame chain only.
    FramePointers,
    /// `-fomit-frame-pointer` with `.eh_frame`: unwound by CFI only.
    Cfi,
}

impl Kernel {
    /// Path of the x86-64 build; builds both on first use in this test binary.
    pub fn path(self) -> PathBuf {
        self.path_for(Arch::X86_64)
    }

    /// Path of this build for `arch`; builds both on first use in this test binary.
    pub fn path_for(self, arch: Arch) -> PathBuf {
        let dir = arch.kernels();
        let name = match self {
            Kernel::FramePointers => "kernel-fp.elf",
            Kernel::Cfi => "kernel-cfi.elf",
        };
        dir.join(name)
    }
}

/// Where QEMU serves its GDB stub.
pub enum Stub {
    /// A loopback TCP port, picked free.
    Tcp,
    /// A Unix socket at this path.
    Unix(PathBuf),
}

/// A booted guest. `remote` is what `stackscope gdb --remote` takes.
pub struct Qemu {
    child: Child,
    pub remote: String,
    pub serial: PathBuf,
    stderr: PathBuf,
}

impl Qemu {
    /// Boots the x86-64 `kernel`; see [`Qemu::boot_arch`].
    pub fn boot(kernel: Kernel, cpus: u32, stub: Stub, dir: &Path) -> Qemu {
        Qemu::boot_arch(Arch::X86_64, kernel, cpus, stub, dir)
    }

    /// Boots `kernel` of `arch` with `cpus` vCPUs, files (serial log, QEMU's stderr) in
    /// `dir`, and waits until every vCPU runs the work loop.
    pub fn boot_arch(arch: Arch, kernel: Kernel, cpus: u32, stub: Stub, dir: &Path) -> Qemu {
        // A port found free may be taken before QEMU binds it: then QEMU exits at once, and
        // another port is tried.
        for _ in 0..5 {
            let (args, remote) = match &stub {
                Stub::Tcp => {
                    let port = free_port();
                    (
                        vec!["-gdb".to_string(), format!("tcp:127.0.0.1:{port}")],
                        format!("127.0.0.1:{port}"),
                    )
                }
                Stub::Unix(path) => (
                    vec![
                        "-chardev".to_string(),
                        format!("socket,path={},server=on,wait=off,id=gdb0", path.display()),
                        "-gdb".to_string(),
                        "chardev:gdb0".to_string(),
                    ],
                    path.display().to_string(),
                ),
            };
            let serial = dir.join("serial.log");
            let stderr = dir.join("qemu.stderr");
            let _ = std::fs::remove_file(&serial);
            let child = arch
                .qemu()
                .args(["-accel", "tcg", "-smp", &cpus.to_string(), "-m", "64"])
                .args(["-display", "none", "-nic", "none", "-no-reboot"])
                .arg("-serial")
                .arg(format!("file:{}", serial.display()))
                .arg("-kernel")
                .arg(kernel.path_for(arch))
                .args(&args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&stderr).expect("create qemu.stderr"))
                .spawn()
                .unwrap_or_else(|e| {
                    panic!(
                        "cannot start qemu-system-{} (scripts/install-deps.sh installs it): {e}",
                        arch.name()
                    )
                });
            let mut qemu = Qemu {
                child,
                remote,
                serial,
                stderr,
            };
            match qemu.wait_running() {
                Ok(()) => return qemu,
                Err(why) if why.contains("in use") && matches!(stub, Stub::Tcp) => continue,
                Err(why) => panic!("{why}"),
            }
        }
        panic!("QEMU found no free port for its GDB stub in 5 tries");
    }

    /// Waits for [`RUNNING_LINE`] on the serial port; an error says why it never came.
    fn wait_running(&mut self) -> Result<(), String> {
        let start = Instant::now();
        loop {
            let log = std::fs::read_to_string(&self.serial).unwrap_or_default();
            if log.contains(RUNNING_LINE) {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait().expect("wait for qemu") {
                return Err(format!(
                    "QEMU exited ({status}) before the guest ran; stderr: {}; serial: {log}",
                    self.stderr_text()
                ));
            }
            if start.elapsed() > BOOT_DEADLINE {
                return Err(format!(
                    "the guest did not print {RUNNING_LINE:?} within {BOOT_DEADLINE:?}; serial: {log:?}; stderr: {}",
                    self.stderr_text()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stderr_text(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.stderr) {
            let _ = f.read_to_string(&mut text);
        }
        text.trim().to_string()
    }

    /// QEMU's pid, to kill it from outside mid-run.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills QEMU now and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A loopback TCP port nobody listens on right now.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("local address").port()
}

//! `stackscope-dtrace`: stands in for dtrace's profile-probe command line
//! (`DTRACE=stackscope-dtrace`).

fn main() {
    stackscope::shim::dtrace::main()
}

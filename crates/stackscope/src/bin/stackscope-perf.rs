//! `stackscope-perf`: stands in for `perf record` and `perf script` (`PERF=stackscope-perf
//! cargo flamegraph`).

fn main() {
    stackscope::shim::perf::main()
}

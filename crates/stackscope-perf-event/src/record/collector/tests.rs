use super::*;

/// Samples at ever new addresses, as a long whole-system recording gives, must not keep
/// a table entry per address: the table is named and merged by function once full.
#[test]
fn a_table_of_ever_new_addresses_is_folded_as_it_fills() {
    let config = SamplerConfig {
        cpu: None,
        frequency: Some(999),
        period: None,
        user: false,
        kernel: true,
        stack_mode: StackMode::FramePointer,
        include_idle: false,
        buffer_pages: 0,
    };
    let mut collector = Collector::new(&config);
    let function = stackscope_testkit::big_kernel_function();
    let samples = 3 * FOLD_AT_NODES as u64;
    let mut largest = 0;
    for i in 0..samples {
        // Two frames in one function, each pair of addresses new: leaf first. A caller's
        // address is looked up one byte back, so it is never the function's first.
        let stack = [function + i % 4096, function + 1 + (i / 4096) % 4095];
        collector.handle(Event::Sample(SampleEvent {
            pid: 1 + (i % 3) as u32,
            tid: 1 + (i % 3) as u32,
            cpu: (i % 2) as u32,
            time: i,
            period: 1_000_000,
            kernel_stack: &stack,
            user_callchain: &[],
            user_regs: None,
            user_stack: &[],
            in_user: false,
        }));
        largest = largest.max(collector.table.nodes());
    }
    assert!(
        largest <= FOLD_AT_NODES,
        "the table grew to {largest} frames (bound {FOLD_AT_NODES})"
    );
    assert!(collector.fold.is_some(), "no table was folded");
    let profile = collector
        .finish(Metadata::default(), &config, false)
        .profile;
    assert_eq!(profile.total_samples(), samples);
    // Every address lies in one function: one frame, one stack per (thread, cpu).
    assert_eq!(profile.frames.len(), 1, "{:?}", profile.frames);
    assert_eq!(profile.stacks.len(), 1);
    assert_eq!(profile.samples.len(), 3 * 2);
}

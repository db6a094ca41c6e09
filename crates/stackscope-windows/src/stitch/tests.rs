use super::*;

const K1: u64 = 0xffff_f800_0010_0100;
const K2: u64 = 0xffff_f800_0010_0200;
const U1: u64 = 0x7ff7_0000_1234;
const U2: u64 = 0x7ffa_0000_5000;

fn frames(out: &[Sample]) -> Vec<(u64, Vec<u64>)> {
    out.iter()
        .map(|s| (s.timestamp, s.frames.clone()))
        .collect()
}

#[test]
fn a_user_mode_sample_is_whole_with_its_one_stack() {
    let mut s = Stitcher::default();
    let mut out = Vec::new();
    s.sample(100, 7, 1, U1, &mut out);
    assert!(out.is_empty(), "the sample waits for its stack");
    s.stack(100, 77, 7, &[U1, U2], &mut out);
    assert_eq!(frames(&out), [(100, vec![U1, U2])]);
    assert_eq!(
        (out[0].pid, out[0].cpu, out[0].user_missing),
        (Some(77), 1, false)
    );
    s.finish(&mut out);
    assert_eq!(out.len(), 1, "nothing else was waiting");
}

#[test]
fn kernel_and_user_parts_arriving_as_two_events_make_one_stack() {
    let mut s = Stitcher::default();
    let mut out = Vec::new();
    s.sample(100, 7, 0, K1, &mut out);
    s.stack(100, 77, 7, &[K1, K2], &mut out);
    assert!(out.is_empty(), "the user part has not come yet");
    // A second sample in the kernel before the thread returns to user mode.
    s.sample(150, 7, 1, K2, &mut out);
    s.stack(150, 77, 7, &[K2], &mut out);
    // Another thread's user stack serves none of them.
    s.stack(160, 77, 8, &[U2], &mut out);
    assert_eq!(frames(&out), [(160, vec![U2])]);
    out.clear();
    // Back in user mode: one user stack for both.
    s.stack(170, 77, 7, &[U1, U2], &mut out);
    assert_eq!(
        frames(&out),
        [(100, vec![K1, K2, U1, U2]), (150, vec![K2, U1, U2])]
    );
    assert_eq!(out[1].cpu, 1);
    assert!(out.iter().all(|s| !s.user_missing));
}

#[test]
fn one_event_holding_both_parts_is_one_stack() {
    let mut s = Stitcher::default();
    let mut out = Vec::new();
    s.sample(100, 7, 0, K1, &mut out);
    s.stack(100, 77, 7, &[K1, U1, U2], &mut out);
    assert_eq!(frames(&out), [(100, vec![K1, U1, U2])]);
}

#[test]
fn kernel_threads_need_no_user_part_and_ended_threads_keep_their_kernel_part() {
    let mut s = Stitcher::default();
    let mut out = Vec::new();
    s.sample(100, 4000, 0, K1, &mut out);
    s.stack(100, 4, 4000, &[K1, K2], &mut out);
    assert_eq!(frames(&out), [(100, vec![K1, K2])]);
    assert!(!out[0].user_missing);
    out.clear();

    s.sample(200, 7, 0, K1, &mut out);
    s.stack(200, 77, 7, &[K1], &mut out);
    s.thread_ended(7, &mut out);
    assert_eq!(frames(&out), [(200, vec![K1])]);
    assert!(out[0].user_missing);
}

#[test]
fn a_sample_without_any_stack_keeps_its_address() {
    let mut s = Stitcher::default();
    let mut out = Vec::new();
    s.sample(100, 7, 0, U1, &mut out);
    s.finish(&mut out);
    assert_eq!(frames(&out), [(100, vec![U1])]);
    assert_eq!(out[0].pid, None);
}

#[test]
fn a_thread_staying_in_the_kernel_holds_a_bounded_number_of_samples() {
    let mut s = Stitcher::default();
    let mut out = Vec::new();
    for t in 0..(MAX_WAITING as u64 + 10) {
        s.sample(t, 7, 0, K1, &mut out);
        s.stack(t, 77, 7, &[K1], &mut out);
    }
    assert_eq!(out.len(), 10);
    assert!(out.iter().all(|s| s.user_missing && s.frames == [K1]));
    s.finish(&mut out);
    assert_eq!(out.len(), MAX_WAITING + 10);
}

//! The end-of-run summary.

mod fixture;

use stackscope_profile::format::summary;
use stackscope_profile::Profile;

#[test]
fn summary_of_the_fixture() {
    assert_eq!(
        summary(&fixture::profile()),
        "31 samples in 2.5 s, 3 lost\n\
         user stacks: 40, 75.0% complete, 15.0% with unknown frames, 10.0% truncated\n\
         hint: 4 stacks were truncated: raise --stack-size\n\
         hint: libfoo.so has no unwind info: rebuild it with -funwind-tables\n"
    );
}

#[test]
fn a_profile_of_time_says_seconds_and_the_time_of_each_root() {
    assert_eq!(
        summary(&fixture::wall()),
        "1.000 s of time (on-cpu 0.200 s, off-cpu 0.800 s) in 1.0 s, 0 lost\n\
         user stacks: none\n"
    );
    let mut off = fixture::wall();
    off.meta.event = "off-cpu".to_string();
    assert!(summary(&off).starts_with("1.000 s of off-cpu time in 1.0 s"));
}

#[test]
fn a_profile_of_memory_says_bytes_and_allocations() {
    assert_eq!(
        summary(&fixture::memory(false)),
        "103000 bytes in 4 allocations in 1.0 s, 0 lost\n\
         user stacks: none\n"
    );
    assert!(summary(&fixture::memory(true))
        .starts_with("103000 bytes in 4 allocations still held at the end in 1.0 s"));
}

#[test]
fn summary_without_user_stacks() {
    assert_eq!(
        summary(&Profile::default()),
        "0 samples in 0.0 s, 0 lost\nuser stacks: none\n"
    );
}

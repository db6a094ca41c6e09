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
fn summary_without_user_stacks() {
    assert_eq!(
        summary(&Profile::default()),
        "0 samples in 0.0 s, 0 lost\nuser stacks: none\n"
    );
}

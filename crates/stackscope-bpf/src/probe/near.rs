//! Near matches for a name that is not there: what a probe error offers instead.

/// How many near matches an error names.
const SHOWN: usize = 5;

/// The names most like `wanted`, best first: those containing it or contained in it, then
/// those a few edits away; at most [`SHOWN`], none when nothing is close.
pub(crate) fn near_matches<'a>(wanted: &str, names: impl Iterator<Item = &'a str>) -> Vec<String> {
    let wanted_lower = wanted.to_lowercase();
    let limit = (wanted.len() / 3).max(2);
    let mut scored: Vec<(usize, &str)> = names
        .filter(|name| !name.is_empty() && *name != wanted)
        .filter_map(|name| {
            let lower = name.to_lowercase();
            let distance = strsim::levenshtein(&wanted_lower, &lower);
            if distance <= limit {
                Some((distance, name))
            } else if lower.contains(&wanted_lower) {
                // Contained: ranked after close spellings, shorter (closer) names first.
                Some((limit + 1 + name.len() - wanted.len(), name))
            } else {
                None
            }
        })
        .collect();
    scored.sort_unstable();
    scored.dedup_by(|a, b| a.1 == b.1);
    scored
        .into_iter()
        .take(SHOWN)
        .map(|(_, name)| name.to_string())
        .collect()
}

/// ": did you mean a, b or c?", or "" when nothing is near.
pub(crate) fn did_you_mean(near: &[String]) -> String {
    match near {
        [] => String::new(),
        [one] => format!("; did you mean {one}?"),
        [init @ .., last] => format!("; did you mean {} or {last}?", init.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_close_spellings_before_longer_names_containing_the_name() {
        let names = [
            "malloc",
            "calloc",
            "realloc",
            "malloc_trim",
            "free",
            "mallocx",
        ];
        let near = near_matches("maloc", names.iter().copied());
        assert_eq!(near[0], "malloc");
        assert!(near.contains(&"calloc".to_string()));
        assert!(!near.contains(&"free".to_string()));
        let near = near_matches("alloc", names.iter().copied());
        assert!(near.contains(&"malloc".to_string()));
        assert!(near_matches("zzzzzzzz", names.iter().copied()).is_empty());
        assert_eq!(
            did_you_mean(&["a".into(), "b".into(), "c".into()]),
            "; did you mean a, b or c?"
        );
        assert_eq!(did_you_mean(&[]), "");
    }
}

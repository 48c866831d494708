//! "Did you mean" for a name the user mistyped: the closest of the names that exist, a
//! different case first (`W1` for `w1`), else by edit distance (strsim's, a swap of two
//! neighbours counting one edit) when it is small next to the name's length.

/// ` (did you mean 'w1'?)`, or nothing when no candidate is close.
pub fn did_you_mean<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    let lower = name.to_lowercase();
    let mut best: Option<(usize, &str)> = None;
    for c in candidates {
        let d = match c.to_lowercase() == lower {
            true => 0,
            false => strsim::osa_distance(&lower, &c.to_lowercase()),
        };
        // Ties go to the first name in order: candidates may come from a hash map.
        if best.is_none_or(|(bd, bc)| d < bd || (d == bd && c < bc)) {
            best = Some((d, c));
        }
    }
    match best {
        // Up to a third of the name's characters may differ (a short name only in case:
        // any one-letter name is one edit from every other).
        Some((d, c)) if d <= name.chars().count() / 3 && c != name => format!(" (did you mean '{c}'?)"),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::did_you_mean;

    #[test]
    fn close_names_are_suggested_and_far_ones_not() {
        assert_eq!(did_you_mean("W1", ["w1", "w2", "x"]), " (did you mean 'w1'?)");
        assert_eq!(did_you_mean("mask", ["ids", "maks"]), " (did you mean 'maks'?)");
        assert_eq!(
            did_you_mean("encoder.layer.0.wieght", ["encoder.layer.0.weight"]),
            " (did you mean 'encoder.layer.0.weight'?)"
        );
        assert_eq!(did_you_mean("zzz", ["w1", "x"]), "");
        assert_eq!(did_you_mean("y", []), "");
        assert_eq!(did_you_mean("z", ["k", "q"]), "");
    }
}

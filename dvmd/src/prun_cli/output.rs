//! `--output` values as mpirun takes them: `tag`, `timestamp`, `merge-stderr-to-stdout`,
//! `dir=DIR[:nocopy]`, `file=PREFIX[:nocopy]`, several separated by ','.

/// One item of an `--output` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Item {
    Tag,
    Timestamp,
    Merge,
    /// Each rank's files under DIR; `true`: only there.
    Dir(String, bool),
    /// Rank N's output in PREFIX.N; `true`: only there.
    File(String, bool),
}

const EXPECTED: &str =
    "expected tag, timestamp, merge-stderr-to-stdout, dir=DIR[:nocopy], file=PREFIX[:nocopy], or several separated by ','";

/// `KEY=PATH[:nocopy]` as (PATH, nocopy).
fn path_of<'a>(item: &'a str, key: &str) -> Option<(&'a str, bool)> {
    let rest = item.strip_prefix(key)?.strip_prefix('=')?;
    Some(rest.strip_suffix(":nocopy").map_or((rest, false), |p| (p, true)))
}

/// The items of `value`, or the sentence saying what is wrong with it.
pub(super) fn parse(value: &str) -> Result<Vec<Item>, &'static str> {
    value
        .split(',')
        .map(|item| match item {
            "tag" => Ok(Item::Tag),
            "timestamp" => Ok(Item::Timestamp),
            "merge-stderr-to-stdout" => Ok(Item::Merge),
            _ => match (path_of(item, "dir"), path_of(item, "file")) {
                (Some(("", _)), _) => Err("dir= needs a directory"),
                (Some((d, nocopy)), _) => Ok(Item::Dir(d.into(), nocopy)),
                (_, Some((f, _))) if f.is_empty() || f.ends_with('/') => Err("file= needs a file name prefix"),
                (_, Some((f, nocopy))) => Ok(Item::File(f.into(), nocopy)),
                _ => Err(EXPECTED),
            },
        })
        .collect()
}

//! `{name}` placeholders in harness and evaluator argv. Only `{identifier}`
//! is a placeholder, so JSON or shell braces in an argument pass through;
//! `{{` writes a literal `{`.

/// The placeholder names in `arg`, in order.
fn names(arg: &str) -> Vec<(usize, usize, &str)> {
    let b = arg.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'{' {
            if b.get(i + 1) == Some(&b'{') {
                i += 2;
                continue;
            }
            let end = arg[i + 1..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map(|e| i + 1 + e);
            if let Some(e) = end
                && e > i + 1
                && b[e] == b'}'
            {
                out.push((i, e + 1, &arg[i + 1..e]));
                i = e + 1;
                continue;
            }
        }
        i += 1;
    }
    out
}

/// The first placeholder of `arg` not in `known`.
pub fn unknown<'a>(arg: &'a str, known: &[&str]) -> Option<&'a str> {
    names(arg)
        .into_iter()
        .map(|(_, _, n)| n)
        .find(|n| !known.contains(n))
}

/// `arg` with every known placeholder replaced; unknown ones stay as written
/// (the job file's check refuses them before anything runs).
pub fn substitute(arg: &str, values: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(arg.len());
    let mut last = 0;
    for (s, e, name) in names(arg) {
        if let Some((_, v)) = values.iter().find(|(k, _)| *k == name) {
            out.push_str(&arg[last..s].replace("{{", "{"));
            out.push_str(v);
            last = e;
        }
    }
    out.push_str(&arg[last..].replace("{{", "{"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_known_names_only() {
        let v = [("workspace", "/w"), ("prompt", "do {it}")];
        assert_eq!(substitute("{workspace}/a", &v), "/w/a");
        assert_eq!(substitute("x={prompt}!", &v), "x=do {it}!");
        assert_eq!(substitute("{\"a\": {workspace}}", &v), "{\"a\": /w}");
        assert_eq!(substitute("{{workspace}}", &v), "{workspace}}");
        assert_eq!(substitute("{other}", &v), "{other}");
    }

    #[test]
    fn finds_unknown_names() {
        assert_eq!(
            unknown("{workspace}/{hiden}", &["workspace"]),
            Some("hiden")
        );
        assert_eq!(unknown("{\"k\": 1} {}", &["workspace"]), None);
        assert_eq!(unknown("{{literal}}", &[]), None);
    }
}

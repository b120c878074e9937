//! HTML text: escaping, and the frame every page sits in (its navigation, what it runs
//! over, whether it refreshes itself).

/// `text` safe inside HTML text and attribute values.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `text` as one URL query value.
pub fn query_value(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// What the frame says about the deployment, on every page.
pub struct Frame<'a> {
    pub at: &'a str,
    pub table: &'a str,
    pub by: &'a str,
    pub definitions_from: &'a str,
}

/// Which part of a page refreshes itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Live {
    /// The element `#live` is read again every 2 s while the page is visible.
    Yes,
    No,
}

/// A whole page: `title`, the navigation (`current` marked), and `body`.
pub fn page(frame: &Frame, title: &str, current: &str, live: Live, body: &str) -> String {
    let nav: String = [("Tasks", "/tasks"), ("Waiting", "/waiting"), ("Agents", "/agents"), ("DLQs", "/dlq")]
        .iter()
        .map(|(name, href)| {
            let class = if *name == current { " class=\"current\"" } else { "" };
            format!("<a href=\"{href}\"{class}>{name}</a>")
        })
        .collect();
    let live_note = match live {
        Live::Yes => {
            "<span id=\"live-note\">live: read again every 2 s while this tab is visible, never while it is hidden</span>"
        }
        Live::No => "<span>not refreshed by itself: reload to read again</span>",
    };
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
<title>{title} · sas console</title><link rel=\"stylesheet\" href=\"/assets/console.css\"></head>\
<body data-live=\"{live}\"><header><strong>sas console</strong><nav>{nav}</nav>\
<span class=\"where\">{at} · table {table} · workflows {defs} · acting as {by}</span></header>\
<main><h1>{title}</h1>{body}</main><footer>{live_note}</footer>\
<script src=\"/assets/console.js\"></script></body></html>\n",
        title = esc(title),
        live = if live == Live::Yes { "yes" } else { "no" },
        at = esc(frame.at),
        table = esc(frame.table),
        defs = esc(frame.definitions_from),
        by = esc(frame.by),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_for_html_and_urls() {
        assert_eq!(esc("<a href=\"x\">'&'</a>"), "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
        assert_eq!(query_value("o 1&x=é"), "o+1%26x%3D%C3%A9");
    }
}

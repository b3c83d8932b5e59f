//! A watch's answer: one JSON event per line, `{"type": …, "object": …}`, for as long as the
//! server keeps the request open.
use std::io::{BufRead as _, BufReader, Read};

use anyhow::{Context as _, Result, bail};
use serde::Deserialize;
use serde_json::Value;

use super::Node;

#[derive(Debug)]
pub enum Event {
    Added(Node),
    Modified(Node),
    /// The node's last state.
    Deleted(Node),
    /// Nothing changed, but the watch has reached this resource version: resuming from it
    /// skips the events already seen, and it does not age out while the cluster is quiet.
    Bookmark(String),
    /// The server gave up on the watch (code 410: the resource version is too old).
    Error {
        code: Option<u64>,
        message: String,
    },
}

#[derive(Deserialize)]
struct Raw {
    #[serde(rename = "type")]
    kind: String,
    object: Value,
}

pub fn parse(line: &str) -> Result<Event> {
    let Raw { kind, object } = serde_json::from_str(line).context("a watch event that is not JSON")?;
    let node = |object| serde_json::from_value::<Node>(object).with_context(|| format!("{kind} event: not a Node"));
    Ok(match kind.as_str() {
        "ADDED" => Event::Added(node(object)?),
        "MODIFIED" => Event::Modified(node(object)?),
        "DELETED" => Event::Deleted(node(object)?),
        "BOOKMARK" => Event::Bookmark(
            object["metadata"]["resourceVersion"].as_str().context("a BOOKMARK without resourceVersion")?.to_string(),
        ),
        // A Status object.
        "ERROR" => Event::Error {
            code: object["code"].as_u64(),
            message: object["message"].as_str().unwrap_or("no message").to_string(),
        },
        _ => bail!("unknown watch event type {kind:?}"),
    })
}

/// The events of one watch request, read as they arrive.
pub struct Stream<R> {
    reader: BufReader<R>,
    line: String,
}

impl<R: Read> Stream<R> {
    pub fn new(body: R) -> Self {
        Self { reader: BufReader::new(body), line: String::new() }
    }

    /// The next event; `None` when the server has ended the watch.
    pub fn next(&mut self) -> Result<Option<Event>> {
        loop {
            self.line.clear();
            if self.reader.read_line(&mut self.line).context("reading the watch")? == 0 {
                return Ok(None);
            }
            if !self.line.ends_with('\n') {
                bail!("the watch ended in the middle of an event");
            }
            if !self.line.trim().is_empty() {
                return parse(&self.line).map(Some);
            }
        }
    }

    /// Whether more of the answer has arrived already: events that come together are handled
    /// together (one route sync for a burst, e.g. many nodes joining at once).
    pub fn has_more(&self) -> bool {
        !self.reader.buffer().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_events_line_by_line() {
        let body = concat!(
            r#"{"type":"ADDED","object":{"kind":"Node","metadata":{"name":"a","resourceVersion":"11"}}}"#,
            "\n\n",
            r#"{"type":"BOOKMARK","object":{"kind":"Node","metadata":{"resourceVersion":"12"}}}"#,
            "\n",
            r#"{"type":"ERROR","object":{"kind":"Status","status":"Failure","message":"too old resource version: 1 (12)","reason":"Expired","code":410}}"#,
            "\n",
        );
        let mut stream = Stream::new(body.as_bytes());
        let Some(Event::Added(a)) = stream.next().unwrap() else { panic!("ADDED") };
        assert_eq!((a.metadata.name.as_str(), a.metadata.resource_version.as_deref()), ("a", Some("11")));
        assert!(stream.has_more());
        assert!(matches!(stream.next().unwrap(), Some(Event::Bookmark(rv)) if rv == "12"));
        let Some(Event::Error { code, message }) = stream.next().unwrap() else { panic!("ERROR") };
        assert_eq!((code, message.as_str()), (Some(410), "too old resource version: 1 (12)"));
        assert!(!stream.has_more());
        assert!(stream.next().unwrap().is_none(), "the end of the watch");
    }

    #[test]
    fn a_cut_event_is_an_error() {
        let mut stream = Stream::new(r#"{"type":"MODIFIED","object":{"metadata":{"na"#.as_bytes());
        assert!(stream.next().unwrap_err().to_string().contains("middle of an event"));
    }

    #[test]
    fn refuses_what_is_not_an_event() {
        assert!(parse(r#"{"type":"SOMETHING","object":{}}"#).is_err());
        assert!(parse(r#"{"type":"ADDED","object":{"spec":{}}}"#).is_err(), "a node has a name");
        assert!(parse(r#"{"type":"BOOKMARK","object":{"metadata":{}}}"#).is_err());
        assert!(matches!(parse(r#"{"type":"DELETED","object":{"metadata":{"name":"b"}}}"#), Ok(Event::Deleted(_))));
    }
}

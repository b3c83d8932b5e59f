//! How `inspect` prints what it read: an aligned table for people, JSON for scripts. Every view
//! is a list of rows that serialise to JSON objects and render to table cells.
use anyhow::Context as _;
use clap::ValueEnum;
use serde::Serialize;

#[derive(Clone, Copy, Debug, Default, ValueEnum)]
pub enum Format {
    #[default]
    Table,
    Json,
}

/// One row of a view: its JSON form is the row's fields; its table form, these cells.
pub trait Row: Serialize {
    const HEADERS: &'static [&'static str];
    fn cells(&self) -> Vec<String>;
}

pub fn print<R: Row>(rows: &[R], format: Format) -> anyhow::Result<()> {
    let text = match format {
        Format::Json => format!("{}\n", serde_json::to_string_pretty(rows)?),
        Format::Table => render(R::HEADERS, rows.iter().map(Row::cells)),
    };
    crate::cli::write_stdout(&text).context("writing to stdout")?;
    Ok(())
}

/// Columns padded to their widest cell, two spaces apart, no trailing blanks.
fn render(headers: &[&str], rows: impl Iterator<Item = Vec<String>>) -> String {
    let lines: Vec<Vec<String>> =
        std::iter::once(headers.iter().map(|h| h.to_string()).collect()).chain(rows).collect();
    let mut widths = vec![0; headers.len()];
    for line in &lines {
        for (w, cell) in widths.iter_mut().zip(line) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for line in &lines {
        let padded: Vec<String> = line.iter().zip(&widths).map(|(c, w)| format!("{c:w$}")).collect();
        out.push_str(padded.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn columns_align() {
        let rows = vec![vec!["10.0.0.2".to_string(), "7".into()], vec!["1.1.1.1".into(), "1234".into()]];
        assert_eq!(super::render(&["IP", "N"], rows.into_iter()), "IP        N\n10.0.0.2  7\n1.1.1.1   1234\n");
    }
}

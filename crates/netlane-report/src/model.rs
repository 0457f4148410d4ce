//! The report model: numbers and words, no markup. Every renderer (terminal, JSON,
//! CSV, HTML with SVG charts) reads the same values, and the JSON Schema in `docs/` is
//! generated from these types.
//!
//! Conventions (see `docs/output.md`): units are part of field and column names
//! (`tx_cpu_s_per_gb`, `rx_mb_per_s`), MB is 10^6 bytes, a missing value is `null`
//! (JSON) or empty (CSV), never 0.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize, Serializer};

/// Version of the JSON layout; raised when a field changes meaning or goes away.
pub const SCHEMA_VERSION: u32 = 2;

/// One cell of a table.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A number, printed with its column's decimals.
    Num(f64),
    /// A count.
    Int(u64),
    /// Words.
    Text(String),
    /// No value (not measured, or undefined such as CPU per GB of nothing).
    Missing,
}

impl Value {
    /// A number; NaN and infinities become [`Value::Missing`].
    pub fn num(v: f64) -> Value {
        if v.is_finite() { Value::Num(v) } else { Value::Missing }
    }

    /// A number if there is one.
    pub fn opt(v: Option<f64>) -> Value {
        v.map_or(Value::Missing, Value::num)
    }

    /// Words.
    pub fn text(s: impl Into<String>) -> Value {
        Value::Text(s.into())
    }

    /// The number in the cell, if any.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Num(v) => Some(*v),
            Value::Int(v) => Some(*v as f64),
            _ => None,
        }
    }
}

impl Serialize for Value {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Num(v) if v.is_finite() => s.serialize_f64(*v),
            Value::Int(v) => s.serialize_u64(*v),
            Value::Text(t) => s.serialize_str(t),
            _ => s.serialize_none(),
        }
    }
}

impl JsonSchema for Value {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Value".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A number, words, or null when there is no value.",
            "type": ["number", "string", "null"]
        })
    }
}

/// A column: a machine key with the unit in it, and a label for people.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct Column {
    /// snake_case key with the unit, e.g. `tx_cpu_s_per_gb`.
    pub key: String,
    /// Header for people, e.g. `tx CPU s/GB`.
    pub label: String,
    /// Decimals when printed for people.
    pub decimals: u8,
}

impl Column {
    /// A column.
    pub fn new(key: &str, label: &str, decimals: u8) -> Column {
        Column { key: key.into(), label: label.into(), decimals }
    }
}

/// A row, with an optional footnote (diagnostics such as the path taken).
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// One value per column.
    pub cells: Vec<Value>,
    /// Shown as a numbered footnote under the table.
    pub footnote: Option<String>,
}

impl Row {
    /// A row without a footnote.
    pub fn new(cells: Vec<Value>) -> Row {
        Row { cells, footnote: None }
    }
}

/// A table of measurements.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    /// File stem of its CSV.
    pub name: String,
    /// Caption.
    pub title: String,
    /// Columns.
    pub columns: Vec<Column>,
    /// Rows.
    pub rows: Vec<Row>,
}

impl Table {
    /// An empty table.
    pub fn new(name: &str, title: impl Into<String>, columns: Vec<Column>) -> Table {
        Table { name: name.into(), title: title.into(), columns, rows: Vec::new() }
    }

    /// Adds a row; a row with the wrong number of cells is a bug in the scenario.
    pub fn push(&mut self, row: Row) {
        debug_assert_eq!(row.cells.len(), self.columns.len(), "table {}: row width", self.name);
        self.rows.push(row);
    }

    /// The footnotes, numbered from 1 in row order, identical texts once.
    pub fn footnotes(&self) -> Vec<String> {
        let mut notes: Vec<String> = Vec::new();
        for r in &self.rows {
            if let Some(n) = &r.footnote
                && !notes.contains(n)
            {
                notes.push(n.clone());
            }
        }
        notes
    }

    /// The footnote number (from 1) of row `i`, if it has one.
    pub fn footnote_number(&self, i: usize) -> Option<usize> {
        let n = self.rows.get(i)?.footnote.as_ref()?;
        self.footnotes().iter().position(|f| f == n).map(|p| p + 1)
    }
}

impl Serialize for Table {
    /// `{name, title, columns, rows: [{key: value, ...}], footnotes}`: each row an
    /// object keyed by the columns' keys, in column order.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeStruct};
        struct RowObj<'a>(&'a [Column], &'a Row, Option<usize>);
        impl Serialize for RowObj<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut m = s.serialize_map(Some(self.0.len() + 1))?;
                for (c, v) in self.0.iter().zip(&self.1.cells) {
                    m.serialize_entry(&c.key, v)?;
                }
                if let Some(n) = self.2 {
                    m.serialize_entry("footnote", &n)?;
                }
                m.end()
            }
        }
        let rows: Vec<RowObj<'_>> =
            self.rows.iter().enumerate().map(|(i, r)| RowObj(&self.columns, r, self.footnote_number(i))).collect();
        let mut st = s.serialize_struct("Table", 5)?;
        st.serialize_field("name", &self.name)?;
        st.serialize_field("title", &self.title)?;
        st.serialize_field("columns", &self.columns)?;
        st.serialize_field("rows", &rows)?;
        st.serialize_field("footnotes", &self.footnotes())?;
        st.end()
    }
}

impl JsonSchema for Table {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Table".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let column = generator.subschema_for::<Column>();
        let value = generator.subschema_for::<Value>();
        schemars::json_schema!({
            "description": "A table: rows are objects keyed by the columns' keys; `footnote` (optional) numbers the row's entry in `footnotes`, from 1.",
            "type": "object",
            "required": ["name", "title", "columns", "rows", "footnotes"],
            "additionalProperties": false,
            "properties": {
                "name": {"type": "string"},
                "title": {"type": "string"},
                "columns": {"type": "array", "items": column},
                "rows": {"type": "array", "items": {
                    "type": "object",
                    "properties": {"footnote": {"type": "integer", "minimum": 1}},
                    "additionalProperties": value
                }},
                "footnotes": {"type": "array", "items": {"type": "string"}}
            }
        })
    }
}

/// How a check compares.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, JsonSchema, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// value < target
    Below,
    /// value <= target
    AtMost,
    /// value > target
    Above,
    /// value >= target
    AtLeast,
    /// lower <= value <= upper
    Within,
}

impl Op {
    /// The word JSON and CSV use (`at_most`).
    pub fn name(self) -> &'static str {
        match self {
            Op::Below => "below",
            Op::AtMost => "at_most",
            Op::Above => "above",
            Op::AtLeast => "at_least",
            Op::Within => "within",
        }
    }
}

/// What a check wants.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema, Deserialize)]
pub struct Target {
    /// The comparison.
    pub op: Op,
    /// The bound (the lower one for `within`).
    pub value: f64,
    /// The upper bound of `within`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upper: Option<f64>,
    /// Unit of the compared value (`x` for a ratio).
    pub unit: String,
}

/// The outcome of a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, JsonSchema, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Every paired sample meets the target.
    Met,
    /// The target lies inside the spread of the samples: some pairs meet it, some not.
    WithinNoise,
    /// No sample meets the target.
    Missed,
    /// The inputs were degenerate (nothing moved, no CPU time, NaN, an empty
    /// histogram, an impossible run): counts as missed, never as met.
    Invalid,
    /// Not measured in this run (a mode it needs was not run).
    Skipped,
    /// Not shown on this machine: it needs more CPUs (or hardware) than the machine
    /// has; the reason says how many and the plan it would use. Neither met nor
    /// invalid.
    NotShown,
}

impl Outcome {
    /// The name in JSON and CSV (`within_noise`, `not_shown`).
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Met => "met",
            Outcome::WithinNoise => "within_noise",
            Outcome::Missed => "missed",
            Outcome::Invalid => "invalid",
            Outcome::Skipped => "skipped",
            Outcome::NotShown => "not_shown",
        }
    }

    /// Lower-case words for pages.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Met => "met",
            Outcome::WithinNoise => "within noise",
            Outcome::Missed => "missed",
            Outcome::Invalid => "invalid",
            Outcome::Skipped => "skipped",
            Outcome::NotShown => "not shown on this machine",
        }
    }

    /// Whether `--strict` treats it as a failure (everything but met, within noise and
    /// not shown: a machine too small to show an effect is not a failure of what runs
    /// on it).
    pub fn fails_strict(self) -> bool {
        matches!(self, Outcome::Missed | Outcome::Invalid | Outcome::Skipped)
    }
}

/// What a check measured: one value per pair (or per run), their median and range.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema, Deserialize)]
pub struct Measured {
    /// Median of the samples.
    pub median: f64,
    /// Smallest sample.
    pub min: f64,
    /// Largest sample.
    pub max: f64,
    /// Every sample, in round order.
    pub samples: Vec<f64>,
}

/// A target checked against numbers measured in the same run.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema, Deserialize)]
pub struct Check {
    /// Stable identifier, `<scenario>.<check>`.
    pub id: String,
    /// What is checked, in words.
    pub name: String,
    /// What it wants.
    pub target: Target,
    /// What was measured (none when skipped or invalid before measuring).
    pub measured: Option<Measured>,
    /// The outcome.
    pub outcome: Outcome,
    /// Why it is invalid or skipped; for the others, how the samples were formed.
    pub reason: String,
}

/// A result that should not be read as a plain row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FlagKind {
    /// Cannot be true (the receiver counted more than was sent).
    Impossible,
    /// One repeat far below (or above) its siblings.
    Collapsed,
    /// Repeats spread by more than half their median.
    Noisy,
    /// A mode lost most of its data: its cost per byte sent understates the cost per
    /// byte delivered.
    Lossy,
    /// The run did not reach its intended state (warm-up, a queue that failed).
    Incomplete,
}

impl FlagKind {
    /// The word people read.
    pub fn name(self) -> &'static str {
        match self {
            FlagKind::Impossible => "impossible",
            FlagKind::Collapsed => "collapsed",
            FlagKind::Noisy => "noisy",
            FlagKind::Lossy => "lossy",
            FlagKind::Incomplete => "incomplete",
        }
    }
}

/// A warning about a result.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct Flag {
    /// What kind of problem.
    pub kind: FlagKind,
    /// The mode or row it concerns.
    pub subject: String,
    /// What was seen.
    pub message: String,
}

/// One measured run, the same shape in every scenario.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema, Deserialize)]
pub struct RunRecord {
    /// Position in execution order, from 1.
    pub index: u32,
    /// The round it belongs to, from 1 (a round runs every mode once; pairs for ratios
    /// are taken within a round).
    pub round: u32,
    /// The mode (or contender) it measured.
    pub label: String,
    /// Its figures, units in the names; undefined ones are left out.
    pub metrics: BTreeMap<String, f64>,
    /// The kernel paths that actually ran.
    pub path: Vec<String>,
    /// The engine's complete result.
    pub detail: serde_json::Value,
}

impl RunRecord {
    /// A record; non-finite metrics are dropped.
    pub fn new(index: u32, round: u32, label: impl Into<String>, metrics: Vec<(&str, Option<f64>)>) -> RunRecord {
        RunRecord {
            index,
            round,
            label: label.into(),
            metrics: metrics
                .into_iter()
                .filter_map(|(k, v)| v.filter(|v| v.is_finite()).map(|v| (k.to_string(), v)))
                .collect(),
            path: Vec::new(),
            detail: serde_json::Value::Null,
        }
    }
}

/// What values on an axis are, so renderers can print `250 µs`, `1.2 M`, `40%`.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case", tag = "kind", content = "name")]
pub enum Unit {
    /// Seconds (printed as ns, µs, ms or s).
    Seconds,
    /// Bytes per second (printed with decimal prefixes: MB/s).
    BytesPerSecond,
    /// A percentage, 0..100.
    Percent,
    /// A ratio (`0.5x`).
    Ratio,
    /// A quantity with decimal prefixes (k, M, G) and this unit name (`IOPS`, `pps`,
    /// `s/GB`, `flows`).
    Count(String),
    /// Categories (bar groups).
    Category,
    /// Percentile rank on a "nines" axis: x = -log10(1 - p/100), so 50, 90, 99, 99.9
    /// and 99.99 are evenly spaced.
    Nines,
}

/// Linear or logarithmic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Scale {
    /// Linear, from zero for bars.
    Linear,
    /// Base-10 logarithmic.
    Log,
}

/// A chart axis.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct Axis {
    /// What is on it.
    pub label: String,
    /// How its values print.
    pub unit: Unit,
    /// Its scale.
    pub scale: Scale,
    /// Names of the categories (x of bar charts: point x is the index).
    pub categories: Vec<String>,
}

impl Axis {
    /// A numeric axis.
    pub fn numeric(label: &str, unit: Unit, scale: Scale) -> Axis {
        Axis { label: label.into(), unit, scale, categories: Vec::new() }
    }

    /// A category axis.
    pub fn categories(label: &str, names: Vec<String>) -> Axis {
        Axis { label: label.into(), unit: Unit::Category, scale: Scale::Linear, categories: names }
    }
}

/// One point, with the range of its repeats (error bar) when there were several.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, JsonSchema)]
pub struct Point {
    /// x (the category index on a category axis).
    pub x: f64,
    /// y (a median across repeats).
    pub y: f64,
    /// Lowest repeat.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub low: Option<f64>,
    /// Highest repeat.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub high: Option<f64>,
}

impl Point {
    /// The median of `repeats` at `x`, with their range when there are several; None
    /// when no repeat has a finite value.
    pub fn of(x: f64, repeats: &[f64]) -> Option<Point> {
        let s = Spread::of(repeats)?;
        let several = s.n > 1;
        Some(Point { x, y: s.median, low: several.then_some(s.min), high: several.then_some(s.max) })
    }
}

/// A named series.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Points; undefined values are left out.
    pub points: Vec<Point>,
}

/// Bars, lines or a percentile plot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChartKind {
    /// Bars over categories, on a linear axis from zero.
    Bars,
    /// Dots with error bars over categories, on any axis (for values that span
    /// orders of magnitude, where bar lengths would mean nothing).
    Dots,
    /// Lines with markers over a numeric or category x axis.
    Lines,
    /// Latency by percentile on a "nines" x axis.
    Percentiles,
}

/// A chart as data: one unit per axis.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct Chart {
    /// File stem of its SVG.
    pub name: String,
    /// Caption.
    pub title: String,
    /// Kind.
    pub kind: ChartKind,
    /// x axis.
    pub x: Axis,
    /// y axis.
    pub y: Axis,
    /// Series.
    pub series: Vec<Series>,
}

/// Everything one scenario produced.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct ScenarioReport {
    /// Short name (`udp-bulk`).
    pub name: String,
    /// Heading.
    pub title: String,
    /// What it measures and how to read it.
    pub description: String,
    /// The one line a reader needs first.
    pub headline: String,
    /// Every resolved option, with typed values; `echo` turns it into arguments.
    pub options: serde_json::Map<String, serde_json::Value>,
    /// The options as `key=value` pairs that the command line accepts back.
    pub echo: Vec<String>,
    /// Measurements.
    pub tables: Vec<Table>,
    /// Charts.
    pub charts: Vec<Chart>,
    /// Target checks.
    pub checks: Vec<Check>,
    /// Results that must not be read as plain rows.
    pub flags: Vec<Flag>,
    /// Observations worth reading.
    pub notes: Vec<String>,
    /// Every measured run.
    pub runs: Vec<RunRecord>,
    /// Where each role ran (the scenario's CPU plan; empty where it places nothing).
    pub cpu_plan: Vec<RoleCpus>,
}

/// The CPUs one role of a scenario ran on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct RoleCpus {
    /// The role (`lane`, `napi`, `generator`).
    pub role: String,
    /// Its CPUs, thread by thread.
    pub cpus: Vec<usize>,
    /// The role it runs beside, sharing its CPUs, when the machine had too few to keep
    /// them apart.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub beside: Option<String>,
}

/// Counts of check outcomes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, JsonSchema)]
pub struct Tally {
    /// Met.
    pub met: usize,
    /// Within noise.
    pub within_noise: usize,
    /// Missed.
    pub missed: usize,
    /// Invalid.
    pub invalid: usize,
    /// Skipped.
    pub skipped: usize,
    /// Not shown on this machine.
    pub not_shown: usize,
}

impl Tally {
    /// Counts `checks`.
    pub fn of<'a>(checks: impl IntoIterator<Item = &'a Check>) -> Tally {
        let mut t = Tally::default();
        for c in checks {
            match c.outcome {
                Outcome::Met => t.met += 1,
                Outcome::WithinNoise => t.within_noise += 1,
                Outcome::Missed => t.missed += 1,
                Outcome::Invalid => t.invalid += 1,
                Outcome::Skipped => t.skipped += 1,
                Outcome::NotShown => t.not_shown += 1,
            }
        }
        t
    }

    /// Checks that fail under `--strict`.
    pub fn strict_failures(&self) -> usize {
        self.missed + self.invalid + self.skipped
    }

    /// `3 met, 1 within noise, 2 missed, 0 invalid` (skipped and not shown only when
    /// some were).
    pub fn sentence(&self) -> String {
        let mut s = format!(
            "{} met, {} within noise, {} missed, {} invalid",
            self.met, self.within_noise, self.missed, self.invalid
        );
        if self.skipped > 0 {
            s.push_str(&format!(", {} skipped", self.skipped));
        }
        if self.not_shown > 0 {
            s.push_str(&format!(", {} not shown on this machine", self.not_shown));
        }
        s
    }
}

/// Where and with what a result was produced.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema, Deserialize)]
pub struct Provenance {
    /// `netlane`.
    pub tool: String,
    /// The crate version.
    pub version: String,
    /// The git commit it was built from (`unknown` outside a checkout).
    pub git_commit: String,
    /// Identifies this invocation in every CSV row: `<UTC start>-<pid>`.
    pub run_id: String,
    /// Start, RFC 3339 UTC.
    pub started_at: String,
    /// The command line.
    pub command: Vec<String>,
}

/// The machine.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema, Deserialize)]
pub struct Host {
    /// Kernel release.
    pub kernel: String,
    /// CPU model name.
    pub cpu_model: String,
    /// CPUs online.
    pub cpus: usize,
    /// Memory, GiB.
    pub memory_gib: f64,
}

/// How busy the machine was around the measurement.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct MachineState {
    /// 1-minute load average at the start.
    pub load_avg_1m_start: Option<f64>,
    /// 1-minute load average at the end.
    pub load_avg_1m_end: Option<f64>,
    /// Share of all CPUs busy in a half-second sample before anything started, %.
    pub busy_pct_before: Option<f64>,
    /// Share of CPU time the hypervisor stole in that sample, %.
    pub steal_pct_before: Option<f64>,
    /// Share of CPU time stolen over the whole measurement, %.
    pub steal_pct_during: Option<f64>,
    /// Seconds the measurement took.
    pub seconds: Option<f64>,
    /// Warnings about the state (a busy machine makes noisy numbers).
    pub warnings: Vec<String>,
}

/// What `netlane lab` and `netlane bench` produce.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct Results {
    /// The machine's state around the run.
    pub machine: MachineState,
    /// All checks counted.
    pub summary: Tally,
    /// A quick lab (`--quick`): one round per scenario and shorter runs, a check that the
    /// paths work rather than a measurement.
    pub quick: bool,
    /// The scenarios.
    pub scenarios: Vec<ScenarioReport>,
}

/// Every JSON document netlane writes: the same header, then the body of its kind.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Document<T> {
    /// Layout version: raised when a field changes meaning or goes away.
    pub schema_version: u32,
    /// What the document is: the command that wrote it (`lab`, `bench`, `probe`,
    /// `compare`, `kv-load`, ...; every kind and its schema in docs/schema/).
    pub kind: String,
    /// Tool, version, commit, invocation.
    pub provenance: Provenance,
    /// The machine.
    pub host: Host,
    /// The body.
    #[serde(flatten)]
    pub body: T,
}

/// Median and range of a set of repeats.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    /// Median.
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
    /// How many finite values.
    pub n: usize,
}

impl Spread {
    /// Over the finite values (None when there are none).
    pub fn of(values: &[f64]) -> Option<Spread> {
        let v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        Some(Spread {
            median: netlane::metrics::median(v.clone()),
            min: v.iter().copied().fold(f64::INFINITY, f64::min),
            max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            n: v.len(),
        })
    }

    /// (max - min) / median; None for one value or a zero median.
    pub fn relative(&self) -> Option<f64> {
        (self.n > 1 && self.median != 0.0).then(|| (self.max - self.min) / self.median.abs())
    }
}

//! A seeded family of protocol-mode scenarios drawn from a wide space of
//! conditions (`cargo xtask bench-accuracy`), their figures per class, and
//! the regression gate's comparison against a baseline.
//!
//! Pure: sampling is a function of `(seed, index)` alone, so any one member
//! can be drawn (and written as a TOML scenario) without the others, and a
//! family of `count` members is the first `count` of an endless sequence.
//! Members are stratified: member `i` is of class `i mod CLASSES.len()`, so
//! every class is drawn as evenly as the count allows and a small family
//! covers every class once. Every member runs the agent's shipped settings
//! except the degree, a deployment choice the space spans (3–10).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::{
    Isolation, LeaderChange, Mode, ProtocolReport, QueueKind, Scenario, recovery::RECOVERY_WINDOWS,
};

/// How the probes are stamped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stamps {
    Nic,
    Software,
}

/// How heavy the queues' tail is: Pareto shape below [`HEAVY_TAIL_SHAPE`] is heavy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tail {
    Heavy,
    Light,
}

/// Run length against the software stamps' 32 s history span.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Length {
    /// Shorter than the history span: fits never reach their full history.
    Short,
    /// One to a few minutes.
    Medium,
    /// Ten minutes or more: whatever accumulates shows.
    Long,
}

/// A member's class: the figures are summarised per class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Class {
    pub stamps: Stamps,
    pub tail: Tail,
    pub length: Length,
}

impl Class {
    /// A short stable name, e.g. `nic/heavy/long`.
    pub fn name(&self) -> String {
        let stamps = match self.stamps {
            Stamps::Nic => "nic",
            Stamps::Software => "software",
        };
        let tail = match self.tail {
            Tail::Heavy => "heavy",
            Tail::Light => "light",
        };
        let length = match self.length {
            Length::Short => "short",
            Length::Medium => "medium",
            Length::Long => "long",
        };
        format!("{stamps}/{tail}/{length}")
    }

    /// The goal for the p99 |error| at the result in this class.
    pub fn goal_p99_ns(&self) -> f64 {
        match self.stamps {
            Stamps::Nic => 20.0,
            Stamps::Software => 300.0,
        }
    }
}

/// Every class, in the order members are stratified over.
pub const CLASSES: [Class; 12] = {
    use Length::*;
    use Stamps::*;
    use Tail::*;
    [
        class(Nic, Heavy, Short),
        class(Software, Heavy, Short),
        class(Nic, Light, Short),
        class(Software, Light, Short),
        class(Nic, Heavy, Medium),
        class(Software, Heavy, Medium),
        class(Nic, Light, Medium),
        class(Software, Light, Medium),
        class(Nic, Heavy, Long),
        class(Software, Heavy, Long),
        class(Nic, Light, Long),
        class(Software, Light, Long),
    ]
};

const fn class(stamps: Stamps, tail: Tail, length: Length) -> Class {
    Class {
        stamps,
        tail,
        length,
    }
}

/// Pareto shapes below this are a heavy tail (the space spans 1.2–3).
pub const HEAVY_TAIL_SHAPE: f64 = 1.8;

/// Scored windows (1 s each at the shipped defaults) per run length: short
/// ones end before the 32 s software history is full, long ones last 10+
/// minutes.
fn windows_of(length: Length, rng: &mut ChaCha8Rng) -> u32 {
    match length {
        Length::Short => rng.random_range(12..=28),
        Length::Medium => rng.random_range(60..=180),
        Length::Long => rng.random_range(600..=660),
    }
}

/// Nodes per run length: long runs are smaller so the family stays cheap.
fn nodes_of(length: Length, rng: &mut ChaCha8Rng) -> u32 {
    match length {
        Length::Short | Length::Medium => rng.random_range(16..=40),
        Length::Long => rng.random_range(12..=20),
    }
}

/// One member of a family: its index, class and scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Member {
    pub index: u32,
    pub class: Class,
    pub scenario: Scenario,
}

/// The first `count` members of the family `seed`.
pub fn sample(seed: u64, count: u32) -> Vec<Member> {
    (0..count).map(|i| member(seed, i)).collect()
}

/// Member `index` of the family `seed`, drawn from its own stream.
pub fn member(seed: u64, index: u32) -> Member {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(u64::from(index));
    let class = CLASSES[index as usize % CLASSES.len()];
    let scenario = draw_scenario(seed, index, class, &mut rng);
    Member {
        index,
        class,
        scenario,
    }
}

/// Uniform in `[lo, hi]`.
fn between(rng: &mut ChaCha8Rng, lo: f64, hi: f64) -> f64 {
    lo + (hi - lo) * rng.random::<f64>()
}

fn draw_scenario(seed: u64, index: u32, class: Class, rng: &mut ChaCha8Rng) -> Scenario {
    let mut s = Scenario {
        name: format!("family-{seed}-{index}-{}", class.name().replace('/', "-")),
        mode: Mode::Protocol,
        seed: rng.random(),
        nodes: nodes_of(class.length, rng),
        windows: windows_of(class.length, rng),
        ..Scenario::default()
    };
    s.agent.degree = rng.random_range(3..=10);
    s.reference = rng.random_range(1..s.nodes);
    draw_clocks_and_links(&mut s, class, rng);
    draw_stamps(&mut s, class, rng);
    draw_faults(&mut s, rng);
    s
}

fn draw_clocks_and_links(s: &mut Scenario, class: Class, rng: &mut ChaCha8Rng) {
    s.clock.drift_spread_ppm = between(rng, 0.0, 50.0);
    s.clock.wander_ppb_per_sqrt_s = between(rng, 0.3, 5.0);
    let lo = between(rng, 1_000.0, 5_000.0);
    s.link.base_delay_ns = [lo, lo + between(rng, 0.0, 10_000.0)];
    s.link.loss = between(rng, 0.0, 0.10);
    // NIC-stamped fabrics are symmetric within ports of a switch; the
    // asymmetry no stamp removes would otherwise be all their error shows.
    let max_asymmetry = match class.stamps {
        Stamps::Nic => 20.0,
        Stamps::Software => 200.0,
    };
    s.link.asymmetry_ns = between(rng, 0.0, max_asymmetry);
    s.queue.kind = QueueKind::Pareto;
    s.queue.pareto_shape = match class.tail {
        Tail::Heavy => between(rng, 1.2, HEAVY_TAIL_SHAPE),
        Tail::Light => between(rng, HEAVY_TAIL_SHAPE, 3.0),
    };
    s.queue.busy_probability = between(rng, 0.1, 0.7);
    s.queue.mean_ns = between(rng, 1_000.0, 10_000.0);
}

fn draw_stamps(s: &mut Scenario, class: Class, rng: &mut ChaCha8Rng) {
    let t = &mut s.timestamps;
    match class.stamps {
        Stamps::Nic => {
            t.nic = true;
            t.resolution_ns = [1, 4, 8][rng.random_range(0..3)];
            t.late_tx_probability = between(rng, 0.0, 0.002);
        }
        Stamps::Software => {
            t.nic = false;
            t.tx_early_mean_ns = between(rng, 50.0, 500.0);
            t.rx_late_mean_ns = between(rng, 100.0, 1_500.0);
        }
    }
}

/// A leader change in about a third of the members, an isolation of a few
/// nodes in about a quarter (where the run is long enough to watch it end).
fn draw_faults(s: &mut Scenario, rng: &mut ChaCha8Rng) {
    if rng.random::<f64>() < 0.35 {
        let to = other_node(s, rng, &[s.reference]);
        s.leader_change = Some(LeaderChange {
            after_window: rng.random_range(0..s.windows),
            to,
        });
    }
    let watch = RECOVERY_WINDOWS + 5;
    if rng.random::<f64>() < 0.25 && s.windows > watch + 4 {
        let windows = rng.random_range(3..=(s.windows - watch).min(60));
        let after_window = rng.random_range(0..=s.windows - watch - windows);
        let count = rng.random_range(1..=3);
        let mut nodes = Vec::new();
        for _ in 0..count {
            let mut taken: Vec<u32> = s.leading_nodes().collect();
            taken.extend(&nodes);
            nodes.push(other_node(s, rng, &taken));
        }
        nodes.sort_unstable();
        s.isolation = Some(Isolation {
            nodes,
            after_window,
            windows,
        });
    }
}

/// A node of `s` not in `taken` (nodes ≥ 12, at most 5 taken).
fn other_node(s: &Scenario, rng: &mut ChaCha8Rng, taken: &[u32]) -> u32 {
    loop {
        let n = rng.random_range(0..s.nodes);
        if !taken.contains(&n) {
            return n;
        }
    }
}

/// What one member's run measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub index: u32,
    pub class: Class,
    pub scenario: String,
    /// p99 |error| at the result's anchor, ns.
    pub p99_ns: f64,
    /// p99 |error| of a result just before the next replaced it, ns.
    pub aged_p99_ns: f64,
    /// The same for an oracle that knew the truth and its rate at every
    /// anchor: the clocks' wander alone ([`ProtocolReport::aged_floor_abs_error_ns`]).
    #[serde(default)]
    pub aged_floor_p99_ns: f64,
    /// The aged p99 had every result's drift been the true rate at its
    /// anchor ([`ProtocolReport::aged_true_rate_abs_error_ns`]).
    #[serde(default)]
    pub aged_true_rate_p99_ns: f64,
    pub drift_p99_ppb: f64,
    /// Fraction of results (and of aged results) within their bound. After
    /// a hand-over a result counts as within only if its bound also covers
    /// the original timeline (the first leader's clock, wandering on) at
    /// its anchor: the lower of the two fractions.
    pub coverage: f64,
    pub aged_coverage: f64,
    pub results: usize,
    /// An isolation's members: the worst |error| their readers answered
    /// over the recovery span after it (what the young-history rules act on).
    pub recovery_max_ns: Option<f64>,
    pub wall_ms: f64,
}

/// The fraction of results on a continued timeline within their bound of
/// the original one (1 without a hand-over).
fn coverage_vs_original(r: &ProtocolReport) -> f64 {
    if r.continued_results == 0 {
        return 1.0;
    }
    r.coverage_vs_original
}

impl Outcome {
    pub fn of(member: &Member, r: &ProtocolReport) -> Self {
        Outcome {
            index: member.index,
            class: member.class,
            scenario: member.scenario.name.clone(),
            p99_ns: r.abs_error_ns.p99,
            aged_p99_ns: r.aged_abs_error_ns.p99,
            aged_floor_p99_ns: r.aged_floor_abs_error_ns.p99,
            aged_true_rate_p99_ns: r.aged_true_rate_abs_error_ns.p99,
            drift_p99_ppb: r.drift_abs_error_ppb.p99,
            coverage: r.coverage.min(coverage_vs_original(r)),
            aged_coverage: r.aged_coverage,
            results: r.results,
            recovery_max_ns: r.recovery.as_ref().map(|rec| {
                rec.max_abs_error_ns
                    .iter()
                    .map(|[isolated, _]| *isolated)
                    .fold(0.0, f64::max)
            }),
            wall_ms: r.wall_ms,
        }
    }

    /// Both coverages, at the result and aged, are complete.
    pub fn fully_covered(&self) -> bool {
        self.coverage >= 1.0 && self.aged_coverage >= 1.0
    }

    /// Whether these results, each extrapolated at the true rate at its
    /// anchor, would still age past 1.5 × their p99 at the result: no
    /// drift estimate meets the aged goal for them. (The wander floor alone
    /// over 1.5 × says the same for any offsets of this p99, but misses
    /// that the offset's own error ages along with the wander.)
    pub fn aged_goal_out_of_reach(&self) -> bool {
        self.aged_true_rate_p99_ns.max(self.aged_floor_p99_ns) > 1.5 * self.p99_ns
    }

    /// How far over its class's goal the p99 at the result is (1 = at it).
    pub fn goal_ratio(&self) -> f64 {
        self.p99_ns / self.class.goal_p99_ns()
    }
}

/// p50 / p90 / max of one figure over a class's members.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub p50: f64,
    pub p90: f64,
    pub max: f64,
}

impl Spread {
    fn of(mut values: Vec<f64>) -> Self {
        let [p50, p90, max] = crate::report::quantiles(&mut values, [0.5, 0.9, 1.0]);
        Spread { p50, p90, max }
    }
}

/// One class's figures over its members.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassSummary {
    pub class: String,
    pub members: usize,
    pub p99_ns: Spread,
    pub aged_p99_ns: Spread,
    /// Lowest coverage at the result and aged over the class's members.
    pub min_coverage: f64,
    pub min_aged_coverage: f64,
    /// Members with an isolation, and over them [`Outcome::recovery_max_ns`].
    pub isolations: usize,
    pub recovery_max_ns: Option<Spread>,
    /// Members within the class's goal at the result, and aged within
    /// 1.5 × their own p99 at the result.
    pub within_goal: usize,
    pub aged_within_1_5x: usize,
    /// Members whose results miss the aged goal even at the true rate
    /// ([`Outcome::aged_goal_out_of_reach`]).
    #[serde(default)]
    pub aged_out_of_reach: usize,
}

/// A family's figures per class.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FamilySummary {
    pub seed: u64,
    pub count: u32,
    pub classes: Vec<ClassSummary>,
}

/// Summarises outcomes per class, in [`CLASSES`] order (empty classes left out).
pub fn summarize(seed: u64, count: u32, outcomes: &[Outcome]) -> FamilySummary {
    let classes = CLASSES
        .iter()
        .filter_map(|class| {
            let of: Vec<&Outcome> = outcomes.iter().filter(|o| o.class == *class).collect();
            (!of.is_empty()).then(|| summarize_class(*class, &of))
        })
        .collect();
    FamilySummary {
        seed,
        count,
        classes,
    }
}

fn summarize_class(class: Class, of: &[&Outcome]) -> ClassSummary {
    let min = |f: fn(&Outcome) -> f64| of.iter().map(|o| f(o)).fold(f64::INFINITY, f64::min);
    ClassSummary {
        class: class.name(),
        members: of.len(),
        p99_ns: Spread::of(of.iter().map(|o| o.p99_ns).collect()),
        aged_p99_ns: Spread::of(of.iter().map(|o| o.aged_p99_ns).collect()),
        min_coverage: min(|o| o.coverage),
        min_aged_coverage: min(|o| o.aged_coverage),
        isolations: of.iter().filter(|o| o.recovery_max_ns.is_some()).count(),
        recovery_max_ns: {
            let r: Vec<f64> = of.iter().filter_map(|o| o.recovery_max_ns).collect();
            (!r.is_empty()).then(|| Spread::of(r))
        },
        within_goal: of.iter().filter(|o| o.goal_ratio() <= 1.0).count(),
        aged_within_1_5x: of
            .iter()
            .filter(|o| o.aged_p99_ns <= 1.5 * o.p99_ns)
            .count(),
        aged_out_of_reach: of.iter().filter(|o| o.aged_goal_out_of_reach()).count(),
    }
}

/// The `k` members furthest over their class's goal, worst first.
pub fn worst(outcomes: &[Outcome], k: usize) -> Vec<&Outcome> {
    let mut sorted: Vec<&Outcome> = outcomes.iter().collect();
    sorted.sort_by(|a, b| b.goal_ratio().total_cmp(&a.goal_ratio()));
    sorted.truncate(k);
    sorted
}

/// How much worse a class median may be than its baseline before the gate fails.
pub const GATE_TOLERANCE: f64 = 0.10;

/// Why the gate failed, one line each.
pub fn gate(baseline: &FamilySummary, now: &FamilySummary) -> Vec<String> {
    let mut failures = Vec::new();
    if (baseline.seed, baseline.count) != (now.seed, now.count) {
        failures.push(format!(
            "baseline is of seed {} count {}, this run seed {} count {}",
            baseline.seed, baseline.count, now.seed, now.count
        ));
        return failures;
    }
    for c in &now.classes {
        if c.min_coverage < 1.0 || c.min_aged_coverage < 1.0 {
            failures.push(format!(
                "{}: coverage {:.5} at the result, {:.5} aged (must be 1)",
                c.class, c.min_coverage, c.min_aged_coverage
            ));
        }
        let Some(b) = baseline.classes.iter().find(|b| b.class == c.class) else {
            failures.push(format!("{}: not in the baseline", c.class));
            continue;
        };
        let recovery = |x: &ClassSummary| x.recovery_max_ns.map_or(0.0, |r| r.p50);
        let medians = [
            ("p99 at result", b.p99_ns.p50, c.p99_ns.p50),
            ("aged p99", b.aged_p99_ns.p50, c.aged_p99_ns.p50),
            ("worst reader after an isolation", recovery(b), recovery(c)),
        ];
        for (what, was, is) in medians {
            if is > was * (1.0 + GATE_TOLERANCE) {
                failures.push(format!(
                    "{}: median {what} {is:.1} ns, baseline {was:.1} ns (+{:.0} %, more than {:.0} %)",
                    c.class,
                    100.0 * (is / was - 1.0),
                    100.0 * GATE_TOLERANCE
                ));
            }
        }
    }
    failures
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_is_the_same_whether_drawn_alone_or_in_its_family() {
        let family = sample(7, 30);
        assert_eq!(family[17], member(7, 17));
        assert_eq!(sample(7, 18)[17], family[17]);
        assert_ne!(member(8, 17).scenario, family[17].scenario);
    }

    #[test]
    fn members_are_valid_protocol_scenarios_spanning_the_space() {
        let family = sample(1, 240);
        for m in &family {
            let s = &m.scenario;
            s.validate()
                .unwrap_or_else(|e| panic!("member {}: {e}", m.index));
            assert_eq!(s.mode, Mode::Protocol);
            assert_ne!(s.reference, 0);
            assert_eq!(s.timestamps.nic, m.class.stamps == Stamps::Nic);
            let heavy = s.queue.pareto_shape < HEAVY_TAIL_SHAPE;
            assert_eq!(heavy, m.class.tail == Tail::Heavy);
            assert!((1.2..=3.0).contains(&s.queue.pareto_shape));
            assert!((0.1..=0.7).contains(&s.queue.busy_probability));
            assert!((1_000.0..=10_000.0).contains(&s.queue.mean_ns));
            assert!((0.0..=0.1).contains(&s.link.loss));
            assert!((0.3..=5.0).contains(&s.clock.wander_ppb_per_sqrt_s));
            assert!(s.clock.drift_spread_ppm <= 50.0);
            assert!(s.link.asymmetry_ns <= 200.0);
            assert!((3..=10).contains(&s.agent.degree));
            let span_s = s.windows
                * s.agent
                    .probe_window
                    .div_floor(clockmesh_core::time::Nanos::from_secs(1)) as u32;
            match m.class.length {
                Length::Short => assert!(span_s < 32),
                Length::Medium => assert!((32..600).contains(&span_s)),
                Length::Long => assert!(span_s >= 600),
            }
        }
        let with = |f: fn(&Scenario) -> bool| family.iter().filter(|m| f(&m.scenario)).count();
        assert!(with(|s| s.leader_change.is_some()) > 40);
        assert!(with(|s| s.isolation.is_some()) > 20);
        for class in CLASSES {
            assert_eq!(family.iter().filter(|m| m.class == class).count(), 20);
        }
    }

    #[test]
    fn only_the_degree_differs_from_the_shipped_settings() {
        for m in sample(3, 24) {
            let shipped = clockmesh_core::settings::Settings {
                degree: m.scenario.agent.degree,
                ..Default::default()
            };
            assert_eq!(m.scenario.agent, shipped);
            assert_eq!(m.scenario.estimator, None);
        }
    }

    #[test]
    fn a_member_written_as_toml_reads_back_the_same() {
        for m in sample(5, 12) {
            let text = toml::to_string(&m.scenario).unwrap();
            assert_eq!(Scenario::from_toml_str(&text).unwrap(), m.scenario);
        }
    }

    fn outcome(index: u32, class: Class, p99: f64, aged: f64, coverage: f64) -> Outcome {
        Outcome {
            index,
            class,
            scenario: format!("m{index}"),
            p99_ns: p99,
            aged_p99_ns: aged,
            aged_floor_p99_ns: 0.0,
            aged_true_rate_p99_ns: 0.0,
            drift_p99_ppb: 0.0,
            coverage,
            aged_coverage: 1.0,
            results: 100,
            recovery_max_ns: None,
            wall_ms: 1.0,
        }
    }

    #[test]
    fn a_class_is_summarised_by_its_spread_and_goals() {
        let nic = CLASSES[0];
        let outs: Vec<Outcome> = (0..10)
            .map(|i| outcome(i, nic, 5.0 + 5.0 * f64::from(i), 10.0, 1.0))
            .collect();
        let s = summarize(1, 10, &outs);
        assert_eq!(s.classes.len(), 1);
        let c = &s.classes[0];
        assert_eq!((c.members, c.class.as_str()), (10, "nic/heavy/short"));
        assert_eq!(c.p99_ns.max, 50.0);
        assert_eq!(c.p99_ns.p90, 45.0);
        assert_eq!(c.p99_ns.p50, 30.0);
        assert_eq!(c.within_goal, 4); // 5, 10, 15, 20 ns
        assert_eq!(c.aged_within_1_5x, 9); // all but p99 5 (aged 10 > 7.5)
        assert_eq!(worst(&outs, 1)[0].index, 9);
    }

    /// Out of reach means the results miss the aged goal even at the true
    /// rate; a floor under 1.5 × is not enough when the offset's own error
    /// ages along with the wander.
    #[test]
    fn the_aged_goal_is_out_of_reach_when_the_true_rate_misses_it() {
        let nic = CLASSES[0];
        let with = |floor: f64, true_rate: f64| Outcome {
            aged_floor_p99_ns: floor,
            aged_true_rate_p99_ns: true_rate,
            ..outcome(0, nic, 10.0, 20.0, 1.0)
        };
        assert!(!with(8.0, 14.0).aged_goal_out_of_reach());
        assert!(with(12.0, 16.0).aged_goal_out_of_reach());
        assert!(with(11.0, 16.0).aged_goal_out_of_reach());
        // Figures written before the true-rate one: the floor alone.
        assert!(with(16.0, 0.0).aged_goal_out_of_reach());
        let s = summarize(1, 3, &[with(8.0, 14.0), with(11.0, 16.0), with(16.0, 0.0)]);
        assert_eq!(s.classes[0].aged_out_of_reach, 2);
    }

    #[test]
    fn the_gate_fails_on_a_median_over_10_percent_or_any_coverage_short_of_1() {
        let c = CLASSES[1];
        let base = summarize(1, 3, &[outcome(0, c, 100.0, 120.0, 1.0)]);
        let same = base.clone();
        assert!(gate(&base, &same).is_empty());
        let slightly = summarize(1, 3, &[outcome(0, c, 109.0, 131.0, 1.0)]);
        assert!(gate(&base, &slightly).is_empty());
        let worse = summarize(1, 3, &[outcome(0, c, 111.0, 120.0, 1.0)]);
        assert_eq!(gate(&base, &worse).len(), 1);
        let uncovered = summarize(1, 3, &[outcome(0, c, 90.0, 100.0, 0.999)]);
        assert_eq!(gate(&base, &uncovered).len(), 1);
        let other_family = summarize(2, 3, &[outcome(0, c, 100.0, 120.0, 1.0)]);
        assert_eq!(gate(&base, &other_family).len(), 1);
        let isolated = |worst: f64| Outcome {
            recovery_max_ns: Some(worst),
            ..outcome(0, c, 100.0, 120.0, 1.0)
        };
        let base = summarize(1, 3, &[isolated(200.0)]);
        assert!(gate(&base, &summarize(1, 3, &[isolated(215.0)])).is_empty());
        assert_eq!(gate(&base, &summarize(1, 3, &[isolated(300.0)])).len(), 1);
    }
}

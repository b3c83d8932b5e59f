//! Label selectors (`matchLabels` and `matchExpressions`), checked once when a policy is read
//! and then matched against many label sets.
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

pub type Labels = BTreeMap<String, String>;

/// A selector known to be valid. Every requirement must hold (an empty selector matches all).
#[derive(Clone, Debug, Default)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

#[derive(Clone, Debug)]
enum Requirement {
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Selector {
    /// The API's rules: `In`/`NotIn` need values, `Exists`/`DoesNotExist` none; anything else
    /// is refused (said why), never read as "matches all".
    pub fn parse(selector: &LabelSelector) -> Result<Self, String> {
        let mut requirements: Vec<Requirement> = Vec::new();
        for (key, value) in selector.match_labels.iter().flatten() {
            requirements.push(Requirement::In(key.clone(), BTreeSet::from([value.clone()])));
        }
        for e in selector.match_expressions.iter().flatten() {
            let values: BTreeSet<String> = e.values.iter().flatten().cloned().collect();
            let key = e.key.clone();
            let requirement = match (e.operator.as_str(), values.is_empty()) {
                ("In", false) => Requirement::In(key, values),
                ("NotIn", false) => Requirement::NotIn(key, values),
                ("Exists", true) => Requirement::Exists(key),
                ("DoesNotExist", true) => Requirement::DoesNotExist(key),
                ("In" | "NotIn", true) => return Err(format!("{} {key:?} without values", e.operator)),
                ("Exists" | "DoesNotExist", false) => return Err(format!("{} {key:?} with values", e.operator)),
                (other, _) => return Err(format!("unknown operator {other:?}")),
            };
            requirements.push(requirement);
        }
        Ok(Self { requirements })
    }

    pub fn matches(&self, labels: &Labels) -> bool {
        self.requirements.iter().all(|r| match r {
            Requirement::In(key, values) => labels.get(key).is_some_and(|v| values.contains(v)),
            Requirement::NotIn(key, values) => labels.get(key).is_none_or(|v| !values.contains(v)),
            Requirement::Exists(key) => labels.contains_key(key),
            Requirement::DoesNotExist(key) => !labels.contains_key(key),
        })
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn expression(key: &str, operator: &str, values: &[&str]) -> LabelSelectorRequirement {
        let values = (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect());
        LabelSelectorRequirement { key: key.into(), operator: operator.into(), values }
    }

    fn selector(expressions: Vec<LabelSelectorRequirement>) -> Selector {
        Selector::parse(&LabelSelector { match_expressions: Some(expressions), match_labels: None }).unwrap()
    }

    #[test]
    fn empty_matches_everything() {
        assert!(Selector::parse(&LabelSelector::default()).unwrap().matches(&labels(&[])));
        assert!(Selector::parse(&LabelSelector::default()).unwrap().matches(&labels(&[("a", "b")])));
    }

    #[test]
    fn match_labels_all_must_hold() {
        let s = LabelSelector { match_labels: Some(labels(&[("app", "web"), ("tier", "1")])), ..Default::default() };
        let s = Selector::parse(&s).unwrap();
        assert!(s.matches(&labels(&[("app", "web"), ("tier", "1"), ("x", "y")])));
        assert!(!s.matches(&labels(&[("app", "web")])));
        assert!(!s.matches(&labels(&[("app", "db"), ("tier", "1")])));
    }

    #[test]
    fn expressions() {
        let is_in = selector(vec![expression("app", "In", &["a", "b"])]);
        assert!(is_in.matches(&labels(&[("app", "b")])));
        assert!(!is_in.matches(&labels(&[("app", "c")])));
        assert!(!is_in.matches(&labels(&[])));
        let not_in = selector(vec![expression("app", "NotIn", &["a"])]);
        assert!(not_in.matches(&labels(&[])), "NotIn holds for a missing key");
        assert!(not_in.matches(&labels(&[("app", "b")])));
        assert!(!not_in.matches(&labels(&[("app", "a")])));
        let exists = selector(vec![expression("app", "Exists", &[])]);
        assert!(exists.matches(&labels(&[("app", "")])));
        assert!(!exists.matches(&labels(&[])));
        let absent = selector(vec![expression("app", "DoesNotExist", &[])]);
        assert!(absent.matches(&labels(&[])));
        assert!(!absent.matches(&labels(&[("app", "x")])));
    }

    #[test]
    fn invalid_selectors_are_refused() {
        for bad in
            [expression("app", "In", &[]), expression("app", "Exists", &["x"]), expression("app", "Equals", &["x"])]
        {
            let s = LabelSelector { match_expressions: Some(vec![bad]), match_labels: None };
            assert!(Selector::parse(&s).is_err());
        }
    }
}

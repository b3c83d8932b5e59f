//! `--pod`, `--namespace`, `--verdict` and `--type`: which events are printed. A pod or
//! namespace matches an event where it is either end (the pod or the peer), so that `--pod x/a`
//! shows a's denied connections out and the connections denied into others from it.
use super::{
    args::{Kind, Monitor, Verdict},
    event::Record,
};

pub struct Filter {
    pod: Option<String>,
    namespace: Option<String>,
    verdicts: Vec<Verdict>,
    kind: Option<Kind>,
}

impl Filter {
    pub fn new(args: &Monitor) -> Self {
        Self {
            pod: args.pod.clone(),
            namespace: args.namespace.clone(),
            verdicts: args.verdict.clone(),
            kind: args.kind,
        }
    }

    pub fn accepts(&self, record: &Record) -> bool {
        let ends = [(&record.pod, record.pod_ip), (&record.peer, record.peer_ip)];
        if let Some(pod) = &self.pod
            && !ends
                .iter()
                .any(|(name, ip)| name.as_deref() == Some(pod) || ip.is_some_and(|ip| ip.to_string() == *pod))
        {
            return false;
        }
        if let Some(namespace) = &self.namespace
            && !ends
                .iter()
                .any(|(name, _)| name.as_deref().and_then(|n| n.split_once('/')).is_some_and(|(ns, _)| ns == namespace))
        {
            return false;
        }
        let verdict = match record.verdict {
            "allowed" => Verdict::Allowed,
            "denied" => Verdict::Denied,
            _ => Verdict::Dropped,
        };
        if !self.verdicts.is_empty() && !self.verdicts.contains(&verdict) {
            return false;
        }
        let kind = if record.kind == "policy" { Kind::Policy } else { Kind::Drop };
        self.kind.is_none_or(|wanted| wanted == kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(verdict: &'static str, pod: &str, peer: &str) -> Record {
        Record {
            time: String::new(),
            kind: if verdict == "dropped" { "drop" } else { "policy" },
            verdict,
            reason: None,
            pod: Some(pod.into()),
            pod_ip: Some("10.0.0.1".parse().unwrap()),
            direction: None,
            peer: Some(peer.into()),
            peer_ip: Some("10.0.0.2".parse().unwrap()),
            protocol: None,
            src_ip: None,
            src_port: None,
            dst_ip: None,
            dst_port: None,
            policy: None,
            policy_slot: None,
            ifindex: 0,
            len: 0,
        }
    }

    fn filter(pod: Option<&str>, namespace: Option<&str>, verdicts: &[Verdict], kind: Option<Kind>) -> Filter {
        Filter { pod: pod.map(Into::into), namespace: namespace.map(Into::into), verdicts: verdicts.to_vec(), kind }
    }

    #[test]
    fn a_pod_matches_either_end_by_name_or_address() {
        let r = record("denied", "x/a", "y/b");
        assert!(filter(Some("x/a"), None, &[], None).accepts(&r));
        assert!(filter(Some("y/b"), None, &[], None).accepts(&r));
        assert!(filter(Some("10.0.0.2"), None, &[], None).accepts(&r));
        assert!(!filter(Some("x/c"), None, &[], None).accepts(&r));
        assert!(filter(None, Some("y"), &[], None).accepts(&r));
        assert!(!filter(None, Some("z"), &[], None).accepts(&r));
    }

    #[test]
    fn verdicts_and_types_select() {
        let denied = record("denied", "x/a", "y/b");
        let dropped = record("dropped", "x/a", "10.0.0.2");
        let denied_only = filter(None, None, &[Verdict::Denied], None);
        assert!(denied_only.accepts(&denied) && !denied_only.accepts(&dropped));
        let both = filter(None, None, &[Verdict::Denied, Verdict::Dropped], None);
        assert!(both.accepts(&denied) && both.accepts(&dropped));
        let drops = filter(None, None, &[], Some(Kind::Drop));
        assert!(!drops.accepts(&denied) && drops.accepts(&dropped));
    }
}

//! QoS scenario and model tests, and a check that docs/qos.md's rule files parse.

mod golden;
mod model;

/// Every YAML block of docs/qos.md is a rule file that parses, so the page cannot drift
/// from the format.
#[test]
fn the_docs_rule_files_parse() {
    let page = include_str!("../../../../docs/qos.md");
    let blocks: Vec<&str> = page
        .split("```yaml\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .collect();
    assert_eq!(blocks.len(), 2, "the format and the Kubernetes example");
    for block in blocks {
        let set = crate::qos::RuleSet::from_yaml(block).unwrap_or_else(|e| panic!("{e}\n{block}"));
        assert!(!set.rules().is_empty());
    }
}

//! The `NodeInventory` object (the schema sandbox-operator reads) and the
//! CRD generated from it.
//!
//! The consumer's schema has its fields at the top level (no `spec`), which
//! kube's `CustomResource` derive cannot express (it always wraps a spec), so
//! the type is written out and the CRD is assembled here from its schemars
//! schema, run through the same structural transforms kube-derive uses.
//! `make crds` writes the result into `crds/`; a unit test fails when the
//! committed files differ.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceColumnDefinition, CustomResourceDefinition, CustomResourceDefinitionNames,
    CustomResourceDefinitionSpec, CustomResourceDefinitionVersion, CustomResourceValidation,
    JSONSchemaProps,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::schema::StructuralSchemaRewriter;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Group published by default (the CRD the README's installation names).
pub const DEFAULT_GROUP: &str = "sandbox.cocoonstack.io";
/// Group read by published sandbox-operator builds (`--inventory-group`).
pub const EXTENSIONS_GROUP: &str = "extensions.agents.x-k8s.io";
pub const VERSION: &str = "v1beta1";
pub const KIND: &str = "NodeInventory";
pub const PLURAL: &str = "nodeinventories";

/// One node's sandboxes and warm pools, named after the node.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(description = "Sandboxes and warm pools of one sandboxd node, published by vk-sandbox.")]
pub struct NodeInventory {
    /// Filled in by the apiserver; not part of the schema.
    #[serde(default)]
    #[schemars(skip)]
    pub metadata: ObjectMeta,
    /// The node name; equals `metadata.name`.
    pub node: String,
    /// sandboxd's advertised `host:port`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub address: String,
    /// Sandboxes listed by sandboxd, sorted by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub entries: Vec<InventoryEntry>,
    /// sandboxd's configured pools.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend(
        "x-kubernetes-list-type" = "map",
        "x-kubernetes-list-map-keys" = ["template", "net", "size", "engine"]
    ))]
    pub pools: Vec<InventoryPool>,
}

/// One sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InventoryEntry {
    /// `<namespace>/<name>` of the claim (unqualified means the default
    /// namespace), or the sandboxd id when the sandbox has no claim reference.
    pub name: String,
    /// `Running`, `Hibernated` or `Archived`.
    pub phase: String,
    /// sandboxd id.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    /// The claim reference (same value as `name`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub claim_ref: String,
    /// The VM address, when this node's vk-sandbox holds the claim.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub addr: String,
    /// When the sandbox's lease ends (RFC 3339); absent when it never does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "date-time"))]
    pub deadline: Option<String>,
}

/// One warm pool.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InventoryPool {
    /// Image or template name.
    pub template: String,
    /// VMs ready to claim now.
    pub warm: i64,
    /// The pool's effective target.
    pub target: i64,
    /// Network mode.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(extend("default" = ""))]
    pub net: String,
    /// Size tier.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(extend("default" = ""))]
    pub size: String,
    /// VM engine, from sandboxd builds that key pools by it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(extend("default" = ""))]
    pub engine: String,
}

/// The CRD name for `group`.
pub fn crd_name(group: &str) -> String {
    format!("{PLURAL}.{group}")
}

/// `apiVersion` of the object in `group`.
pub fn api_version(group: &str) -> String {
    format!("{group}/{VERSION}")
}

/// The OpenAPI v3 schema of [`NodeInventory`], with `apiVersion`, `kind` and
/// `metadata` added as every CRD carries them.
fn schema() -> Result<JSONSchemaProps, serde_json::Error> {
    let generator = schemars::generate::SchemaSettings::openapi3()
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .with_transform(StructuralSchemaRewriter)
        .into_generator();
    let mut value = generator.into_root_schema_for::<NodeInventory>().to_value();
    if let Some(obj) = value.as_object_mut() {
        obj.remove("title");
        if let Some(props) = obj.get_mut("properties").and_then(|p| p.as_object_mut()) {
            props.insert(
                "apiVersion".into(),
                serde_json::json!({"type": "string", "description": "APIVersion of this object."}),
            );
            props.insert(
                "kind".into(),
                serde_json::json!({"type": "string", "description": "Kind of this object."}),
            );
            props.insert("metadata".into(), serde_json::json!({"type": "object"}));
        }
    }
    serde_json::from_value(value)
}

/// The `NodeInventory` CRD for `group` (cluster-scoped, `v1beta1` served and
/// stored, printer columns Node and Age).
pub fn crd(group: &str) -> Result<CustomResourceDefinition, serde_json::Error> {
    Ok(CustomResourceDefinition {
        metadata: ObjectMeta {
            name: Some(crd_name(group)),
            annotations: Some(BTreeMap::from([(
                "vk-sandbox.cocoonstack.io/generated-by".to_string(),
                "crdgen (make crds)".to_string(),
            )])),
            ..ObjectMeta::default()
        },
        spec: CustomResourceDefinitionSpec {
            group: group.to_string(),
            names: CustomResourceDefinitionNames {
                kind: KIND.into(),
                list_kind: Some(format!("{KIND}List")),
                plural: PLURAL.into(),
                singular: Some("nodeinventory".into()),
                ..CustomResourceDefinitionNames::default()
            },
            scope: "Cluster".into(),
            versions: vec![CustomResourceDefinitionVersion {
                name: VERSION.into(),
                served: true,
                storage: true,
                additional_printer_columns: Some(vec![
                    CustomResourceColumnDefinition {
                        name: "Node".into(),
                        type_: "string".into(),
                        json_path: ".node".into(),
                        ..CustomResourceColumnDefinition::default()
                    },
                    CustomResourceColumnDefinition {
                        name: "Age".into(),
                        type_: "date".into(),
                        json_path: ".metadata.creationTimestamp".into(),
                        ..CustomResourceColumnDefinition::default()
                    },
                ]),
                schema: Some(CustomResourceValidation {
                    open_api_v3_schema: Some(schema()?),
                }),
                ..CustomResourceDefinitionVersion::default()
            }],
            ..CustomResourceDefinitionSpec::default()
        },
        status: None,
    })
}

/// The CRD as the YAML committed under `crds/`.
pub fn crd_yaml(group: &str) -> Result<String, String> {
    let crd = crd(group).map_err(|e| format!("building the NodeInventory schema: {e}"))?;
    let yaml = serde_saphyr::to_string(&crd).map_err(|e| format!("encoding the CRD: {e}"))?;
    Ok(format!(
        "# Generated by `make crds` (src/bin/crdgen.rs) from src/inventory/types.rs; do not edit.\n---\n{yaml}"
    ))
}

/// Path of the committed CRD for `group`, relative to the repository root.
pub fn crd_file(group: &str) -> String {
    format!("crds/{group}_{PLURAL}.yaml")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_crds_equal_the_generated_ones() {
        for group in [DEFAULT_GROUP, EXTENSIONS_GROUP] {
            let path = format!("{}/{}", env!("CARGO_MANIFEST_DIR"), crd_file(group));
            let committed = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{path}: {e}; run `make crds`"));
            assert!(
                committed == crd_yaml(group).unwrap(),
                "{path} differs from the CRD generated from src/inventory/types.rs; run `make crds` and commit"
            );
        }
    }

    #[test]
    fn schema_is_top_level_with_required_fields_and_map_lists() {
        let crd = crd(DEFAULT_GROUP).unwrap();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("nodeinventories.sandbox.cocoonstack.io")
        );
        assert_eq!(crd.spec.scope, "Cluster");
        let s = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
        let root = &s["openAPIV3Schema"];
        assert_eq!(root["required"], serde_json::json!(["node"]));
        assert!(root["properties"].get("spec").is_none());
        let entries = &root["properties"]["entries"];
        assert_eq!(entries["x-kubernetes-list-type"], "map");
        assert_eq!(
            entries["x-kubernetes-list-map-keys"],
            serde_json::json!(["name"])
        );
        let mut req = entries["items"]["required"].as_array().unwrap().clone();
        req.sort_by_key(|v| v.to_string());
        assert_eq!(
            req,
            vec![serde_json::json!("name"), serde_json::json!("phase")]
        );
        assert_eq!(
            entries["items"]["properties"]["deadline"]["format"],
            "date-time"
        );
        let pools = &root["properties"]["pools"];
        assert_eq!(pools["items"]["properties"]["warm"]["type"], "integer");
        assert_eq!(pools["items"]["properties"]["net"]["default"], "");
        let mut req = pools["items"]["required"].as_array().unwrap().clone();
        req.sort_by_key(|v| v.to_string());
        assert_eq!(
            req,
            vec![
                serde_json::json!("target"),
                serde_json::json!("template"),
                serde_json::json!("warm")
            ]
        );
    }

    #[test]
    fn empty_lists_and_fields_are_omitted() {
        let inv = NodeInventory {
            node: "n".into(),
            ..NodeInventory::default()
        };
        let v = serde_json::to_value(&inv).unwrap();
        assert_eq!(v, serde_json::json!({"metadata": {}, "node": "n"}));
    }
}

//! A [`SelectorEngine`] backed by a table of expressions and Rust closures.
//!
//! For tests, benchmarks and the simulated node: selectors read like the CEL a user would
//! write, while their meaning is a closure over the device. An expression that is not in
//! the table does not compile.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::Device;

use super::SelectorEngine;

type Predicate = dyn Fn(&str, &Device) -> Result<bool, String> + Send + Sync;

/// Maps expression text to a closure taking the driver name and the device.
#[derive(Clone, Default)]
pub struct TableEngine {
    table: HashMap<String, Arc<Predicate>>,
}

/// The view a table selector sees: the device as published, borrowed.
pub struct TableView<'d> {
    pub driver: &'d str,
    pub device: &'d Device,
}

impl TableEngine {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) an expression that always evaluates to a boolean.
    pub fn with(
        self,
        expression: &str,
        predicate: impl Fn(&str, &Device) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.with_fallible(expression, move |driver, device| {
            Ok(predicate(driver, device))
        })
    }

    /// Adds an expression whose evaluation may fail, like a CEL lookup of a missing key.
    pub fn with_fallible(
        mut self,
        expression: &str,
        predicate: impl Fn(&str, &Device) -> Result<bool, String> + Send + Sync + 'static,
    ) -> Self {
        self.table
            .insert(expression.to_string(), Arc::new(predicate));
        self
    }
}

impl SelectorEngine for TableEngine {
    type Program = Arc<Predicate>;
    type View<'d> = TableView<'d>;

    fn view<'d>(&self, driver: &'d str, device: &'d Device) -> Result<TableView<'d>, String> {
        Ok(TableView { driver, device })
    }

    fn compile(&self, expression: &str) -> Result<Self::Program, String> {
        self.table
            .get(expression)
            .cloned()
            .ok_or_else(|| format!("expression is not in the selector table: {expression}"))
    }

    fn evaluate(&self, program: &Self::Program, view: &TableView<'_>) -> Result<bool, String> {
        program(view.driver, view.device)
    }
}

/// The string attribute `name` of a device (unqualified, i.e. in the driver's domain).
pub fn string_attribute<'d>(device: &'d Device, name: &str) -> Option<&'d str> {
    device.attributes.as_ref()?.get(name)?.string.as_deref()
}

/// The integer attribute `name` of a device (unqualified).
pub fn int_attribute(device: &Device, name: &str) -> Option<i64> {
    device.attributes.as_ref()?.get(name)?.int
}

//! The allocator's selector engine backed by the Kubernetes-compatible CEL environment: the
//! glue that lets `alloc/` and `cel/` stay independent leaf modules.

use k8s_openapi::api::resource::v1::Device;

use crate::alloc::SelectorEngine;
use crate::cel::{DeviceView, Selector};

/// Evaluates DeviceClass and request selectors exactly as [`crate::cel`] does.
#[derive(Debug, Clone, Copy, Default)]
pub struct CelEngine;

impl SelectorEngine for CelEngine {
    type Program = Selector;
    type View<'d> = DeviceView;

    fn view<'d>(&self, driver: &'d str, device: &'d Device) -> Result<DeviceView, String> {
        DeviceView::from_api(driver, device).map_err(|e| crate::errors::error_chain(&e))
    }

    fn compile(&self, expression: &str) -> Result<Selector, String> {
        Selector::compile(expression).map_err(|e| crate::errors::error_chain(&e))
    }

    fn evaluate(&self, program: &Selector, view: &DeviceView) -> Result<bool, String> {
        program
            .evaluate(view)
            .map_err(|e| crate::errors::error_chain(&e))
    }
}

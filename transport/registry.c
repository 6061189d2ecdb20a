// SPDX-License-Identifier: Apache-2.0
// placeholder: being written
typedef int tp_placeholder_registry;

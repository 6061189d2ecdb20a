# SPDX-License-Identifier: Apache-2.0
# Install: headers, libraries, pkg-config file, CMake package. (Filled in by
# the install issue work; see docs/building.md.)

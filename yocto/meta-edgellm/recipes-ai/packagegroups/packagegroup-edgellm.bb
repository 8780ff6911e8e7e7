# nooelint: oelint.var.suggestedvar.BUGTRACKER
# (There is no public bug tracker.)
SUMMARY = "edgellm: the daemon and the board's default model"
DESCRIPTION = "Everything an edgellm appliance image needs: the daemon with its systemd \
               unit and configuration, and the model its board profile names as default."
SECTION = "ai"
LICENSE = "MIT"

# The model depends on the machine.
PACKAGE_ARCH = "${MACHINE_ARCH}"

inherit packagegroup

# The default model of the board profile (board/*.toml, `default_model`) the daemon detects
# on each machine, so that the configuration installed by edgellm (no model.path) finds it in
# /usr/share/edgellm/models: Qwen2.5-Coder-1.5B on the boards with a profile, the 0.5B on any
# other aarch64 machine (the generic-aarch64 profile). Another model: EDGELLM_MODEL in
# local.conf, e.g. "edgellm-model-smollm2", and model.path in /etc/edgellm/edgellm.toml.
EDGELLM_BOARD_MODEL = "edgellm-model-qwen2.5-coder-0.5b"
# nooelint: oelint.vars.specific (a machine of its BSP layer, not a dependency of this one)
EDGELLM_BOARD_MODEL:raspberrypi4-64 = "edgellm-model-qwen2.5-coder-1.5b"
# nooelint: oelint.vars.specific (a machine of its BSP layer, not a dependency of this one)
EDGELLM_BOARD_MODEL:raspberrypi5 = "edgellm-model-qwen2.5-coder-1.5b"
# nooelint: oelint.vars.specific (a machine of its BSP layer, not a dependency of this one)
EDGELLM_BOARD_MODEL:imx8mp-lpddr4-evk = "edgellm-model-qwen2.5-coder-1.5b"
# nooelint: oelint.vars.specific (a machine of its BSP layer, not a dependency of this one)
EDGELLM_BOARD_MODEL:rock-5b = "edgellm-model-qwen2.5-coder-1.5b"
EDGELLM_MODEL ?= "${EDGELLM_BOARD_MODEL}"

RDEPENDS:${PN} = "\
    ${EDGELLM_MODEL} \
    edgellm \
"

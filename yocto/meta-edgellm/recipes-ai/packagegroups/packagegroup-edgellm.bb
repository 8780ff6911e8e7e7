# nooelint: oelint.var.suggestedvar.BUGTRACKER
# (There is no public bug tracker.)
SUMMARY = "edgellm: the daemon and its default model"
DESCRIPTION = "Everything an edgellm appliance image needs: the daemon with its systemd \
               unit and configuration, and the SmolLM2-135M-Instruct Q4_1 model it loads."
SECTION = "ai"
LICENSE = "MIT"

inherit packagegroup

RDEPENDS:${PN} = "\
    edgellm \
    edgellm-model-smollm2 \
"

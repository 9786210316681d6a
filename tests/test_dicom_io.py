"""read_dicom on DICOMs written with pydicom, against the DICOM pipeline written out by hand here."""

import numpy as np
import pydicom
import pytest
from pydicom.dataset import Dataset
from pydicom.pixels.decoders.base import get_decoder
from pydicom.sequence import Sequence
from pydicom.uid import JPEGBaseline8Bit

from conftest import real_file, write_dicom
from xbench.data.io import ImageReadError, files_by_stem, read_image

SIIM_DICOM = "siim/1.2.276.0.7230010.3.1.4.8323329.6904.1517875201.850819.dcm"
RNG = np.random.default_rng(7)
PIXELS_8 = RNG.integers(0, 256, size=(40, 36), dtype=np.uint8)
PIXELS_12 = RNG.integers(0, 4096, size=(40, 36), dtype=np.uint16)


def linear_window(values, center, width):
    """DICOM PS3.3 C.11.2.1.2.1, LINEAR, with the output range taken as [0, 1]."""
    return np.clip((values - (center - 0.5)) / (width - 1) + 0.5, 0, 1)


def test_uncompressed_8_bit(tmp_path):
    write_dicom(tmp_path / "a.dcm", PIXELS_8)
    image = read_image(tmp_path / "a.dcm")
    assert image.dtype == np.float32 and image.shape == (40, 36)
    np.testing.assert_allclose(image, PIXELS_8 / 255, rtol=0, atol=1e-7)


def test_12_bit_scaled_by_stored_depth_and_monochrome1_inverted(tmp_path):
    write_dicom(tmp_path / "a.dcm", PIXELS_12, BitsStored=12)
    np.testing.assert_allclose(read_image(tmp_path / "a.dcm"), PIXELS_12 / 4095, atol=1e-7)
    write_dicom(tmp_path / "b.dcm", PIXELS_12, BitsStored=12, PhotometricInterpretation="MONOCHROME1")
    np.testing.assert_allclose(read_image(tmp_path / "b.dcm"), 1 - PIXELS_12 / 4095, atol=1e-7)


def test_pixels_beyond_bits_stored_are_scaled_not_clipped(tmp_path):
    """A JPEG 2000 file whose header claims 12 bits over a 16-bit codestream (the case VinDr's own
    tooling guards against): scaling by 4095 would clip most pixels to white. (Uncompressed data
    above Bits Stored is masked away by pydicom, as the standard says, so only compressed data can
    carry it.)"""
    pixels = (np.arange(40 * 36, dtype=np.uint16).reshape(40, 36) * 27).astype(np.uint16)
    assert pixels.max() > 4095 and int(pixels.max()).bit_length() == 16
    write_dicom(tmp_path / "full.dcm", pixels, compression="j2k")
    mislabelled = pydicom.dcmread(tmp_path / "full.dcm")
    mislabelled.BitsStored, mislabelled.HighBit = 12, 11
    mislabelled.save_as(tmp_path / "a.dcm")
    with pytest.warns(UserWarning, match="need 16 bits but Bits Stored says 12"):
        image = read_image(tmp_path / "a.dcm")
    np.testing.assert_allclose(image, pixels / 65535, atol=1e-7)


def test_window_after_rescale_then_monochrome1(tmp_path):
    # modality values v = 2 x - 1024; the window is in modality units
    center, width = 1500.0, 3001.0
    elements = dict(BitsStored=12, RescaleSlope=2, RescaleIntercept=-1024, WindowCenter=center, WindowWidth=width)
    expected = linear_window(2.0 * PIXELS_12 - 1024, center, width)
    assert 0 < (expected == 0).sum() and 0 < (expected == 1).sum(), "the window must clip on both sides"
    write_dicom(tmp_path / "a.dcm", PIXELS_12, **elements)
    np.testing.assert_allclose(read_image(tmp_path / "a.dcm"), expected, atol=1e-6)
    write_dicom(tmp_path / "b.dcm", PIXELS_12, PhotometricInterpretation="MONOCHROME1", **elements)
    np.testing.assert_allclose(read_image(tmp_path / "b.dcm"), 1 - expected, atol=1e-6)


def test_voi_lut_sequence_scaled_by_its_output_depth(tmp_path):
    lut = Dataset()
    lut.LUTDescriptor = [1024, 1000, 10]  # entries, first stored value mapped, bits per entry
    table = (np.arange(1024) // 2 + 100).astype(np.uint16)
    lut.add_new("LUTData", "US", table.tolist())
    write_dicom(tmp_path / "a.dcm", PIXELS_12, BitsStored=12, VOILUTSequence=Sequence([lut]))
    expected = table[np.clip(PIXELS_12.astype(int) - 1000, 0, 1023)] / 1023
    np.testing.assert_allclose(read_image(tmp_path / "a.dcm"), expected, atol=1e-7)


def test_jpeg_baseline_and_jpeg_2000(tmp_path):
    stored = write_dicom(tmp_path / "a.dcm", PIXELS_8, compression="jpeg")
    assert not np.array_equal(stored, PIXELS_8), "JPEG is lossy: the fixture must decode to Pillow's values"
    np.testing.assert_allclose(read_image(tmp_path / "a.dcm"), stored / 255, atol=1e-7)
    write_dicom(tmp_path / "b.dcm", PIXELS_12, compression="j2k", BitsStored=12)
    np.testing.assert_allclose(read_image(tmp_path / "b.dcm"), PIXELS_12 / 4095, atol=1e-7)


def test_missing_codec_names_file_and_codec(tmp_path, monkeypatch):
    write_dicom(tmp_path / "a.dcm", PIXELS_8, compression="jpeg")
    monkeypatch.setattr(get_decoder(JPEGBaseline8Bit), "_available", {})
    with pytest.raises(ImageReadError, match=r"a\.dcm.*JPEG Baseline.*no codec.*install Pillow"):
        read_image(tmp_path / "a.dcm")


def test_truncated_and_pixel_less_files(tmp_path):
    write_dicom(tmp_path / "native.dcm", PIXELS_8)
    data = (tmp_path / "native.dcm").read_bytes()
    (tmp_path / "cut_native.dcm").write_bytes(data[:-100])
    with pytest.raises(ImageReadError, match=r"cut_native\.dcm.*truncated"):
        read_image(tmp_path / "cut_native.dcm")
    write_dicom(tmp_path / "jpeg.dcm", PIXELS_8, compression="jpeg")
    data = (tmp_path / "jpeg.dcm").read_bytes()
    (tmp_path / "cut_jpeg.dcm").write_bytes(data[: len(data) // 2])
    with pytest.raises(ImageReadError, match=r"cut_jpeg\.dcm is truncated"):
        read_image(tmp_path / "cut_jpeg.dcm")
    write_dicom(tmp_path / "pixels.dcm", PIXELS_8)
    dataset = pydicom.dcmread(tmp_path / "pixels.dcm")
    del dataset.PixelData
    dataset.save_as(tmp_path / "no_pixels.dcm")
    with pytest.raises(ImageReadError, match=r"no_pixels\.dcm has no pixel data"):
        read_image(tmp_path / "no_pixels.dcm")
    (tmp_path / "text.dcm").write_text("not a DICOM")
    with pytest.raises(ImageReadError, match=r"cannot read DICOM .*text\.dcm"):
        read_image(tmp_path / "text.dcm")


def test_files_by_stem_walks_nested_trees(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "1.2.3.dcm").touch()
    (tmp_path / "a" / "x.DCM").touch()
    (tmp_path / "a" / "notes.txt").touch()
    assert files_by_stem(tmp_path) == {"1.2.3": tmp_path / "a" / "b" / "1.2.3.dcm", "x": tmp_path / "a" / "x.DCM"}
    (tmp_path / "1.2.3.dcm").touch()
    with pytest.raises(ValueError, match=r"two files named 1\.2\.3\.dcm"):
        files_by_stem(tmp_path)


def test_real_siim_dicom_and_its_monochrome1_twin(real_data):
    image = read_image(real_file(real_data, SIIM_DICOM))
    assert image.shape == (1024, 1024) and image.dtype == np.float32
    assert 0 <= image.min() and image.max() <= 1 and image.std() > 0.05
    inverted = read_image(real_file(real_data, "vindr/Fake_MONOCHROME1.dcm"))
    np.testing.assert_allclose(inverted, 1 - image, rtol=0, atol=np.finfo(np.float32).eps)


def test_values_beyond_16_bits_are_refused_naming_the_file(tmp_path):
    """A decoded image is 16-bit codes and their levels; a 32-bit image spanning more is an error."""
    write_dicom(tmp_path / "wide.dcm", np.array([[0, 70000], [5, 6]], dtype=np.uint32))
    with pytest.raises(ImageReadError, match=r"wide\.dcm.*70001 values.*16 bits or fewer"):
        read_image(tmp_path / "wide.dcm")
    write_dicom(tmp_path / "narrow.dcm", np.array([[0, 60000], [5, 6]], dtype=np.uint32))
    np.testing.assert_array_equal(read_image(tmp_path / "narrow.dcm"), np.array([[0, 60000], [5, 6]]) / np.float32(2**32 - 1))

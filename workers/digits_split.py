"""The train/test split of scikit-learn's digits, pinned: row indices into the 1797 rows of
sklearn/datasets/data/digits.csv.gz, the 1437 training rows first, then the 360 test rows, in the
order `train_test_split(X, y, test_size=0.2, random_state=0, stratify=y)` of scikit-learn 1.9.1
returns them.

Pinned so that reading digits needs neither scikit-learn's import (~1 s, scipy included) nor its
version's shuffling: the records of a digits trial stay the same across scikit-learn upgrades.
tests/workers/test_data.py checks it against scikit-learn's own split. Encoding: little-endian
uint16, zlib-compressed, base64.
"""

from __future__ import annotations

import base64
import zlib

import numpy as np

N_TRAIN, N_TEST = 1437, 360
_SPLIT = (
    "eNoFwQNAGAAUBcD/vppt27abbdu2rZpt1Gzbtm3btnlX1FIDCEJrryKD+QtX4rkUCKMatMFOez2cpdxaz+vQRPnJaTFZ"
    "G/tgmeM/fQ264gBl9UueG2Wpl8AqU6h35uZYolN5pjbWIv4FL1Cey0gpbcPdJANG+DH/hT3eTYl+4hwtdeG9GpUq6zjd"
    "x6k9P756N34mLXSFH+Z8fER2exx94WyT5YDP899ekopKFvsrG5GNH1N8iuJ1NQknQxjLakXsGF/geUK+Gdf9kMbUuhYZ"
    "vXSWrrXxnIIre3p7TedprF6XttrDdspM1JHeWpk14DyKa3957H1QnDJpaZaARvyHF3JdPsmFrLuW5X1S0/tIDf9jMzSf"
    "nJUStMrPSTefYoU9vHW3ChasObyJreA5GlW38XSPhUlYw1NkOieQ9T5JXnFvzqbPsZmicxw74Sk5tvdCYl6KKdqHisgL"
    "KmuD7Kbl52XazxtRYcnMn20HL7Nd+kX2WCzeJef0DgpTOSvvHZGJtuKDLtYs2p7q8SGKZKuRURNTLc4kBbWtt+QTNsYv"
    "IKy8pJy4yomss4/mU5pYXulBzaxxaTXd1fi8mVvxMzpGbWSjndDc1NfG6GxbhTtcDJeNAuZTQuqAhzjKn+SmVJV0PtKf"
    "yie9wV28NJ3hZBzRF1IvTqpP7bmU0eg+kLdbPJtgpaSZpRBwMx/G92CS107htK6xJlRHD0lmiiOtwd7S2sk2bNJUFNMT"
    "cojMoRB0p9hWS1NQd64na2m+FOV3vtXyWBdroKOlOnfCYvrrR3ySdbXpNoMHyAJdxWslkC7SVWsqiXHPS8hUHUvrsEhW"
    "6zsLR8vpFjWUJf5IM+gxLUapkNk/oqoxZZfwUk2iYayt54TWhQpRAyhn83bWxoehg9WmNJRVnnorzeeBfNxfajC9ohhE"
    "dt5eWXGbI/FooU+V3r6Tl/F4uFTFJk5EafBLB+Gn7rDh3oI3WxdeowWoL88i0rV6WbtqWA2LmTzTsvh5ecsR/KI5aupv"
    "9MVJecfPYPoD+3HAKuK2BRnzNOnKlaQobaNwlkJnSRg9ZQVkvya3MlRPr2G5XLCICJYWlhfh/b301A6aW+bZNVqIfBqe"
    "e/pgUty1FJ6TxlE1PkhVuZJd49EUnlJpH59O/6wJT8QEvqhJvCAW2Fz+ah+5H/bSQ49p6X2Y5KObFJsn0HW0o6WSka8i"
    "pSbw+DIQZ/QlN6UmiK5xJYE+tmb8UKfQCCqPFVRRC/MPTWrNabG8xnnvp7tVdSmFynq9r1e1kGRCHV7rl7igX/bcXkzK"
    "8Df/QwPwW6vgCs3weH4Tl3Sbl/MCiIMaPJL+6lDdIiORnjv6GeTRYV5Zoml6TY8GMkbqQzSYP/NFGScIeItGmhGPvKNN"
    "tS4y1scinCTBR5uAEdwYJ7HV01o2OS4tpb2tsKV8GXF4kle0WVhGfTWnTOGM3soGUkSJbEO4lfexG1qKavsL3a5N/Jp/"
    "sBDeSMf5BRe0o3JUN+hMeuB3CXQOiywpOtkme07t9AbVpHJUXurKMunBmyiqtcJcPSEj5J4NokCNrJNoow5GJm5Bna2v"
    "j7F/WEVtpZl01I18VQboDOqj91EZhVGbl2Map/Q1Up0W+1DezhUkmR/28dLehdJJM1zxGlilc6yTB3kbtObr3IGecREM"
    "MUhmWcxvKCpm2FceotOoLQ3HDPnh1XEJG2Wgx/dpXo8iGjyWiieU1NpcjEvwb85kMZFWzlgJXJJx3oGzaymMs61ShKLb"
    "KcnOYTk5f6br+pPmcVkUl44M/ai3rBTv8l1owLtxkXdQPN1Ob2kfNaBPHkSzOYIuwin/R1Hku1eiQt5Tftl2zyO9rRC3"
    "klQ8XL9hNkWh9ZZfsvIla84TqaQG0Go+Qe8o2Db6Q5ps46mhFcdxFJRIXpEnCOteieHf7a2d4gccjePyOt+jp7Ee/eSY"
    "FONHuCK9qY0+8TyUwe/ijVWlxrIFu62KPtCc3hYXUVGe61aNIPs0xMvTSM5Bd7SXfaOD/B2vNbc1RU1M8XB8n+fwFl1E"
    "RfQXZ0ZniYRiVsv78xY7gpHWUlPaUyTTrLSFdmpdymjxNaPc40CpLWZnUVZK6G1fT7G1M2JTV1rtZ3w/9eS/dp6joBvN"
    "xzCLJUdtMsWWwxJFyylxcc9lT6gh9/DFdo++0kmNyS9kkAy3GjbUrslTzql/cACDbYkNlCVS2HboRC7AZ+2ddpU1/kAK"
    "6H1P6p00gd1Ae41Fh2mRr+QOEg/F+Zt19xqSjRLiNp3zUxQgEbkTLUEbC0MlfLOEkXW6Sap7eRtACzW/ruOPFAG5qKRk"
    "oQDPT1X9t+yWl/aJb/ha/qY3/RBXgFNDj2+3NZLsoQUcVXLhmCmF6gmEUEQq469lHbX0AKSl5p6Gc7BII1ltY7Df2lpc"
    "XynJpao+0z5cCP0pSK/ZDl9AFfi2NMRQ/EU0eoXHGoPLaxZ5jCR0n5LZDiSl2b5D8lsMvaZJJSpv8vm6yrrgjo+hX/KI"
    "92ITLvNc74ZVktBrYYAv4XJIrpktnH6nW5LYxAI0lBZKBuuiCdBUq1EWHoKGlEsv0Ce7LNNRkMbwaBxDLSvmB6HW2EbZ"
    "fE6rd6ySl/LvOo4fynNP61MxT7dZWP9APziGVfPKtl2+8Vzrx52pBaLTHYpEbk+ppr1EXAjS6Q/64G35sTS39tyTSks4"
    "zJZvspUu03FLJPtQW9/zIe9pk3k439JieoVDLLv/kdccgRLwa1stn72fPbREvNNLWDqO5mf1mYWlYVTN0tNw+adptAjn"
    "0BX6gftSI/8hDeytl+Tl3EnG+xG7jaVaxxJrch+v93SI5+Lx1gN78FRTWQrU5LweaJG4DkJtpKxEcpyWXTTZ33hrO2Tt"
    "fKlVsRQ2DwdlFE1GXNsj+ayptdb61EKa60EfbQE8wVNLUaSxcD6JI3A0G+QdJZdfpxE4wVewhL5Yfk9nJ30uHkmgzxQO"
    "uKK7uI63pq+Y6oR2WG45zZDKH1Al/SkhuoHvyUW/hU68Un+R8wKvofctkQZJS+SV2jYb27QfRfVDKCfd5RaH8cd8mw/I"
    "Pr/JZ7kMtvBxSsob6B2eIDU/sgzE+KMbfKSGtUaITK3luu2mA5xD5uA577TP+EtXfYu/0Rt2RFPbKNmJu/7ej1ATIVlo"
    "iTwYQ2mdJNQIloEPo4lu5b3cy6PwV82BEXaaXnsvigH1+lbXC+lfTk2RpYC3IpYXlkFKen+/IKN8gn5AdVmG8Bhod3kU"
    "GupHX8R7uJF9QmPKyzlsg6REUz7Hn+ik7fVatNnXWTd7wx/F/BG1l7fSwMdKf/y2iZaXklEF7Y6YlJwy+VAfh7oYrLus"
    "rEfSlhTH42oPKshHqZZUt8NWXwbxG4zW+tzfWvhxHah5uDTe6gF9btU02J/oK39v8fiXP/ODVl/n2zlbizfSQ4dpSTtt"
    "Zz0yf5ceckFzcyKskHSkUsZiSnSJjS/0nXtjN0+XzprdpmEA58NR38/v9bNEx009zX2llK2XeRTFBth77KRb3l/zoKjm"
    "ksZ8ktrQDRkiobxfvugTK8dpZKVF9rGcUrZJM0oiT3iELvOy+sNK2xqqSO+ksP6mM9RM0yErSuKVTNOeyI742O9ZdTvO"
    "a0pajPr+AE09iIfTAvzj0d6RYnlEncUv5Y9Ps+U+lcJwEk0l1ZDEJnoHr8LukzSvDvZ2nNifSG/p6qX1vsSQQTpKK+GO"
    "VKHSfpV+2ntKQBN1qFSgZBKKCp6Tl+sG1LOaEgYZaabP9xXIhvD6kAtYgN2VM3KEV/oX36xTcBRpfIE8sPRyWOfKZ3Wt"
    "6Iu0qA+hrzLLsiCeVPGVtNeiSSwbxVcsDl3wfz4DaTk7TddLtM9m+WzNZtW1Pf5JHq+Nl/5B/gPeg5Hb"
)


def digits_split() -> tuple[np.ndarray, np.ndarray]:
    """(train rows, test rows) as int64 index arrays."""
    rows = np.frombuffer(zlib.decompress(base64.b64decode(_SPLIT)), dtype="<u2").astype(np.int64)
    return rows[:N_TRAIN], rows[N_TRAIN:]

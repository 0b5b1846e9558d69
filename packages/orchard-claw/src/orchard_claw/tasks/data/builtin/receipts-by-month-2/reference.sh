cd /workspace/receipts
mkdir -p 2023-02 && mv scan_1143_10.txt 2023-02/
mkdir -p 2023-09 && mv scan_1917_01.txt 2023-09/
mkdir -p 2023-02 && mv scan_3052_00.txt 2023-02/
mkdir -p 2023-10 && mv scan_3126_07.txt 2023-10/
mkdir -p 2023-10 && mv scan_4222_02.txt 2023-10/
mkdir -p 2023-09 && mv scan_4583_06.txt 2023-09/
mkdir -p 2023-11 && mv scan_5744_03.txt 2023-11/
mkdir -p 2023-02 && mv scan_6008_04.txt 2023-02/
mkdir -p 2023-09 && mv scan_6552_11.txt 2023-09/
mkdir -p 2023-11 && mv scan_7979_05.txt 2023-11/
mkdir -p 2023-11 && mv scan_9292_09.txt 2023-11/
mkdir -p 2023-02 && mv scan_9520_08.txt 2023-02/
mkdir -p .
cat > index.csv <<'ORCHARD_EOF'
month,count,total
2023-02,4,162.67
2023-09,3,85.44
2023-10,2,72.06
2023-11,3,235.43
ORCHARD_EOF
